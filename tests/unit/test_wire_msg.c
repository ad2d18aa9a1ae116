/* Unit tests of the wire protocol codec (src/wire/msg.c) and wire_code_name. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/wire/msg.c"
#include "../../src/wire/codes.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "wire/msg.h"

/* ---- a tiny message builder ---- */

typedef struct mbuf {
	uint8_t *p;
	size_t len, cap;
} mbuf;

static void put(mbuf *b, const void *d, size_t n)
{
	if (n == 0)
		return;
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->len, d, n);
	b->len += n;
}

static void put_u8(mbuf *b, uint8_t v)
{
	put(b, &v, 1);
}

static void put_i32(mbuf *b, int32_t v)
{
	uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
	put(b, x, 4);
}

static void set_i32(mbuf *b, size_t off, int32_t v)
{
	b->p[off] = (uint8_t)v;
	b->p[off + 1] = (uint8_t)(v >> 8);
	b->p[off + 2] = (uint8_t)(v >> 16);
	b->p[off + 3] = (uint8_t)(v >> 24);
}

static void put_doc(mbuf *b, const bson_t *d)
{
	put(b, bson_get_data(d), wire_bson_len(d));
}

static mbuf msg_begin(int32_t request_id, int32_t op_code)
{
	mbuf b = {0};
	put_i32(&b, 0); /* messageLength, patched by msg_end */
	put_i32(&b, request_id);
	put_i32(&b, 0);
	put_i32(&b, op_code);
	return b;
}

static void msg_end(mbuf *b)
{
	set_i32(b, 0, (int32_t)b->len);
}

/* kind 1 section: identifier + docs */
static void put_seq(mbuf *b, const char *id, bson_t **docs, int n)
{
	size_t start = b->len;
	put_i32(b, 0);
	put(b, id, strlen(id) + 1);
	for (int i = 0; i < n; i++)
		put_doc(b, docs[i]);
	set_i32(b, start, (int32_t)(b->len - start));
}

/* Parse a copy of exactly len bytes (heap, exact size: ASan catches overreads). */
static int parse_copy(const uint8_t *p, size_t len, wire_msg *m, uint8_t **keep, int *code,
		      char *err, size_t errlen)
{
	uint8_t *c = malloc(len ? len : 1);
	if (len > 0)
		memcpy(c, p, len);
	*keep = c;
	return wire_msg_parse(c, len, m, code, err, errlen);
}

static char *json(const bson_t *b)
{
	return bson_as_relaxed_extended_json(b, NULL);
}

static void assert_doc_json(const bson_t *b, const char *want)
{
	char *s = json(b);
	assert_string_equal(s, want);
	bson_free(s);
}

/* OP_MSG flags 0; sections: kind 1 "documents" [{_id:1},{_id:2}], then kind 0 body. */
static mbuf build_insert(bool seq_first)
{
	bson_t *body = BCON_NEW("insert", BCON_UTF8("c"), "$db", BCON_UTF8("test"));
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1));
	bson_t *d2 = BCON_NEW("_id", BCON_INT32(2));
	bson_t *docs[2] = {d1, d2};
	mbuf b = msg_begin(77, WIRE_OP_MSG);

	put_i32(&b, 0);
	if (seq_first) {
		put_u8(&b, 1);
		put_seq(&b, "documents", docs, 2);
		put_u8(&b, 0);
		put_doc(&b, body);
	} else {
		put_u8(&b, 0);
		put_doc(&b, body);
		put_u8(&b, 1);
		put_seq(&b, "documents", docs, 2);
	}
	msg_end(&b);
	bson_destroy(body);
	bson_destroy(d1);
	bson_destroy(d2);
	return b;
}

/* ---- tests ---- */

static void test_op_msg_body_and_sequence(void **state)
{
	mbuf b = build_insert(false);
	wire_msg m;
	bson_t cmd;
	uint8_t *keep;
	char err[256] = "";
	int code = -1;

	(void)state;
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
	assert_int_equal(code, 0);
	assert_int_equal(m.hdr.message_length, (int32_t)b.len);
	assert_int_equal(m.hdr.request_id, 77);
	assert_int_equal(m.hdr.response_to, 0);
	assert_int_equal(m.hdr.op_code, 2013);
	assert_int_equal(m.flags, 0);
	assert_false(m.checksum_present);
	assert_false(m.more_to_come);
	assert_false(m.exhaust_allowed);
	assert_int_equal(m.n_seqs, 1);
	assert_string_equal(m.seqs[0].identifier, "documents");
	assert_int_equal(m.seqs[0].n_docs, 2);
	assert_int_equal(m.seqs[0].docs_len, 28); /* two 14-byte {_id: int32} documents */
	assert_doc_json(&m.body, "{ \"insert\" : \"c\", \"$db\" : \"test\" }");

	bson_init(&cmd);
	assert_int_equal(wire_msg_command(&m, &cmd, &code, err, sizeof err), 0);
	assert_doc_json(&cmd, "{ \"insert\" : \"c\", \"$db\" : \"test\", \"documents\" : [ { "
			      "\"_id\" : 1 }, { \"_id\" : 2 } ] }");
	bson_destroy(&cmd);
	free(keep);
	free(b.p);
}

static void test_op_msg_flags(void **state)
{
	bson_t *body = BCON_NEW("ping", BCON_INT32(1), "$db", BCON_UTF8("admin"));
	struct {
		uint32_t flags;
		int rc;
		bool more, exhaust;
	} cases[] = {
		{WIRE_MSG_FLAG_MORE_TO_COME, 0, true, false},
		{WIRE_MSG_FLAG_EXHAUST_ALLOWED, 0, false, true},
		{1u << 17, 0, false, false},   /* optional bit: ignored */
		{1u << 31, 0, false, false},   /* optional bit: ignored */
		{1u << 2, SDB_EPROTO, false, false},  /* required, unknown */
		{1u << 15, SDB_EPROTO, false, false}, /* required, unknown */
	};

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		mbuf b = msg_begin(1, WIRE_OP_MSG);
		wire_msg m;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;

		put_i32(&b, (int32_t)cases[i].flags);
		put_u8(&b, 0);
		put_doc(&b, body);
		msg_end(&b);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err),
				 cases[i].rc);
		if (cases[i].rc == 0) {
			assert_int_equal(m.more_to_come, cases[i].more);
			assert_int_equal(m.exhaust_allowed, cases[i].exhaust);
			assert_int_equal(m.flags, cases[i].flags);
		} else {
			assert_int_equal(code, WIRE_ERR_PROTOCOL_ERROR);
			assert_non_null(strstr(err, "unknown required flag bits"));
		}
		free(keep);
		free(b.p);
	}
	bson_destroy(body);
}

static void test_crc32c(void **state)
{
	(void)state;
	assert_int_equal(wire_crc32c(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(wire_crc32c(0, "", 0), 0);
	/* incremental == one shot */
	assert_int_equal(wire_crc32c(wire_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

static void test_checksum(void **state)
{
	bson_t *body = BCON_NEW("ping", BCON_INT32(1), "$db", BCON_UTF8("admin"));
	mbuf b = msg_begin(5, WIRE_OP_MSG);
	wire_msg m;
	uint8_t *keep;
	char err[256] = "";
	int code = -1;
	uint32_t crc;

	(void)state;
	put_i32(&b, WIRE_MSG_FLAG_CHECKSUM_PRESENT);
	put_u8(&b, 0);
	put_doc(&b, body);
	put_i32(&b, 0);
	msg_end(&b);
	crc = wire_crc32c(0, b.p, b.len - 4);
	set_i32(&b, b.len - 4, (int32_t)crc);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
	assert_true(m.checksum_present);
	assert_doc_json(&m.body, "{ \"ping\" : 1, \"$db\" : \"admin\" }");
	free(keep);

	/* one flipped bit in the body */
	b.p[b.len - 6] ^= 0x01;
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
	assert_int_equal(code, WIRE_ERR_PROTOCOL_ERROR);
	assert_non_null(strstr(err, "checksum mismatch"));
	free(keep);
	b.p[b.len - 6] ^= 0x01;
	/* wrong checksum value */
	set_i32(&b, b.len - 4, (int32_t)(crc + 1));
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
	free(keep);
	free(b.p);
	bson_destroy(body);
}

/* Truncate a valid message at every length, patching messageLength to match, so the
 * parser must find the truncation inside the sections. With the sequence first, no
 * prefix is a valid message; with the body first exactly one is (body only). */
static void test_truncated_every_length(void **state)
{
	(void)state;
	for (int order = 0; order < 2; order++) {
		mbuf b = build_insert(order == 0);
		int ok_count = 0;
		size_t ok_at = 0;
		for (size_t l = 0; l < b.len; l++) {
			mbuf t = {0};
			wire_msg m;
			uint8_t *keep;
			char err[256] = "";
			int code = -1, rc;

			put(&t, b.p, l);
			if (l >= 4)
				set_i32(&t, 0, (int32_t)l);
			rc = parse_copy(t.p, t.len, &m, &keep, &code, err, sizeof err);
			if (rc == 0) {
				ok_count++;
				ok_at = l;
			} else {
				assert_int_equal(rc, SDB_EPROTO);
				assert_true(code == WIRE_ERR_PROTOCOL_ERROR ||
					    code == WIRE_ERR_INVALID_BSON);
				assert_true(err[0] != '\0');
			}
			free(keep);
			free(t.p);
		}
		if (order == 0) {
			assert_int_equal(ok_count, 0);
		} else {
			/* header 16 + flags 4 + kind 1 + body 33 bytes */
			assert_int_equal(ok_count, 1);
			assert_int_equal(ok_at, 16 + 4 + 1 + 33);
		}
		free(b.p);
	}
}

static void test_wrong_lengths(void **state)
{
	mbuf b = build_insert(true);
	struct {
		int32_t claimed;
		int rc;
		int code;
	} cases[] = {
		{0, SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR},
		{15, SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR},
		{-1, SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR},
		{INT32_MIN, SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR},
		{0, SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR}, /* len - 1, set below */
		{0, SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR}, /* len + 1, set below */
		{WIRE_MAX_MESSAGE_SIZE + 1, SDB_ETOOBIG, WIRE_ERR_BSON_TOO_LARGE},
		{INT32_MAX, SDB_ETOOBIG, WIRE_ERR_BSON_TOO_LARGE},
	};

	(void)state;
	cases[4].claimed = (int32_t)b.len - 1;
	cases[5].claimed = (int32_t)b.len + 1;
	assert_true(wire_msg_length_ok(16));
	assert_true(wire_msg_length_ok(WIRE_MAX_MESSAGE_SIZE));
	assert_false(wire_msg_length_ok(15));
	assert_false(wire_msg_length_ok(WIRE_MAX_MESSAGE_SIZE + 1));
	assert_false(wire_msg_length_ok(-16));
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		wire_msg m;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;

		set_i32(&b, 0, cases[i].claimed);
		assert_int_equal(wire_msg_peek_length(b.p), cases[i].claimed);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err),
				 cases[i].rc);
		assert_int_equal(code, cases[i].code);
		free(keep);
	}
	/* a buffer shorter than a header */
	{
		wire_msg m;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;
		assert_int_equal(parse_copy(b.p, 10, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
		free(keep);
	}
	free(b.p);
}

static void test_oversize_body(void **state)
{
	/* a real body of 16 MiB + 1 KiB in a message under maxMessageSizeBytes */
	size_t blen = WIRE_MAX_BSON_SIZE + 1024;
	uint8_t *blob = calloc(1, blen);
	bson_t *body = bson_new();
	mbuf b = msg_begin(9, WIRE_OP_MSG);
	wire_msg m;
	uint8_t *keep;
	char err[256] = "";
	int code = -1;

	(void)state;
	BSON_APPEND_UTF8(body, "insert", "c");
	BSON_APPEND_BINARY(body, "blob", BSON_SUBTYPE_BINARY, blob, (uint32_t)blen);
	put_i32(&b, 0);
	put_u8(&b, 0);
	put_doc(&b, body);
	msg_end(&b);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), SDB_ETOOBIG);
	assert_int_equal(code, WIRE_ERR_BSON_TOO_LARGE);
	assert_non_null(strstr(err, "over maxBsonObjectSize 16777216"));
	free(keep);
	/* a sequence document claiming 16 MiB + 1 in a small message: refused before use */
	free(b.p);
	b = msg_begin(9, WIRE_OP_MSG);
	put_i32(&b, 0);
	put_u8(&b, 1);
	put_i32(&b, 4 + 2 + 8);
	put(&b, "d", 2);
	put_i32(&b, WIRE_MAX_BSON_SIZE + 1);
	put_i32(&b, 0);
	msg_end(&b);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), SDB_ETOOBIG);
	assert_int_equal(code, WIRE_ERR_BSON_TOO_LARGE);
	free(keep);
	free(b.p);
	bson_destroy(body);
	free(blob);
}

static void test_sections_errors(void **state)
{
	bson_t *body = BCON_NEW("ping", BCON_INT32(1), "$db", BCON_UTF8("admin"));
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1));
	enum { DUP_BODY, NO_BODY, BAD_KIND, SEQ_TOO_LONG, SEQ_TOO_SHORT, SEQ_NO_NUL, SEQ_BAD_DOC,
	       SEQ_BAD_UTF8 };
	const char *want[] = {"more than one body section", "no body section",
			      "unknown section kind 2", "document sequence size",
			      "document sequence size", "unterminated document sequence",
			      "invalid document length", "identifier is not valid UTF-8"};

	(void)state;
	for (int c = DUP_BODY; c <= SEQ_BAD_UTF8; c++) {
		mbuf b = msg_begin(3, WIRE_OP_MSG);
		wire_msg m;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;

		put_i32(&b, 0);
		put_u8(&b, 0);
		put_doc(&b, body);
		switch (c) {
		case DUP_BODY:
			put_u8(&b, 0);
			put_doc(&b, body);
			break;
		case NO_BODY:
			b.len -= 1 + wire_bson_len(body);
			put_u8(&b, 1);
			put_seq(&b, "documents", &d1, 1);
			break;
		case BAD_KIND:
			put_u8(&b, 2);
			put_doc(&b, body);
			break;
		case SEQ_TOO_LONG:
			put_u8(&b, 1);
			put_i32(&b, 100);
			put(&b, "x", 2);
			break;
		case SEQ_TOO_SHORT:
			put_u8(&b, 1);
			put_i32(&b, 4);
			break;
		case SEQ_NO_NUL:
			put_u8(&b, 1);
			put_i32(&b, 7);
			put(&b, "abc", 3);
			break;
		case SEQ_BAD_DOC:
			put_u8(&b, 1);
			put_i32(&b, 4 + 2 + 5);
			put(&b, "x", 2);
			put_i32(&b, 3); /* document length 3 < 5 */
			put_u8(&b, 0);
			break;
		case SEQ_BAD_UTF8: /* found by the fuzzer: "\xb7sInfo" */
			put_u8(&b, 1);
			put_seq(&b, "\xb7sInfo", &d1, 1);
			break;
		}
		msg_end(&b);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err),
				 SDB_EPROTO);
		assert_non_null(strstr(err, want[c]));
		assert_int_not_equal(code, 0);
		free(keep);
		free(b.p);
	}
	bson_destroy(body);
	bson_destroy(d1);
}

static void test_invalid_nested_bson(void **state)
{
	bson_t *body = BCON_NEW("find", BCON_UTF8("c"), "filter", "{", "a", BCON_INT32(1), "}");
	mbuf b = msg_begin(3, WIRE_OP_MSG);
	wire_msg m;
	uint8_t *keep;
	char err[256] = "";
	int code = -1;
	size_t body_off;

	(void)state;
	put_i32(&b, 0);
	put_u8(&b, 0);
	body_off = b.len;
	put_doc(&b, body);
	msg_end(&b);
	/* body: 4 len, 0x02 "find\0" 4-byte len "c\0" = 1+5+4+2 = 12, then 0x03 "filter\0" */
	assert_int_equal(b.p[body_off + 4 + 12], 0x03);
	set_i32(&b, body_off + 4 + 12 + 8, 200); /* inner document length beyond its parent */
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
	assert_int_equal(code, WIRE_ERR_INVALID_BSON);
	assert_non_null(strstr(err, "invalid nested document"));
	free(keep);
	free(b.p);
	bson_destroy(body);
}

typedef struct deep_arg {
	const uint8_t *p;
	size_t len;
	wire_msg *m;
	uint8_t **keep;
	int *code;
	char *err;
	size_t errlen;
	int rc;
} deep_arg;

static void *deep_parse(void *arg)
{
	deep_arg *a = arg;

	a->rc = parse_copy(a->p, a->len, a->m, a->keep, a->code, a->err, a->errlen);
	return NULL;
}

/* {} wrapped depth times as {<key>: <previous>} with element type type (0x03 document,
 * 0x04 array): a heap buffer of *len bytes, 8 bytes a level (free it). */
static uint8_t *nested(unsigned depth, uint8_t type, char key, size_t *len)
{
	size_t cap = (size_t)depth * 8 + 5, n = 5;
	uint8_t *d = malloc(cap), *t = malloc(cap);

	assert_non_null(d);
	assert_non_null(t);
	memcpy(d, "\x05\x00\x00\x00\x00", 5); /* {} */
	for (unsigned i = 0; i < depth; i++) {
		size_t m = 4 + 1 + 2 + n + 1;
		t[0] = (uint8_t)m;
		t[1] = (uint8_t)(m >> 8);
		t[2] = (uint8_t)(m >> 16);
		t[3] = (uint8_t)(m >> 24);
		t[4] = type;
		t[5] = (uint8_t)key;
		t[6] = 0;
		memcpy(t + 7, d, n);
		t[7 + n] = 0;
		memcpy(d, t, m);
		n = m;
	}
	free(t);
	*len = n;
	return d;
}

/* Parse the message in b on a thread with a 256 KB stack, as the role's loop thread whose
 * stack overflowed, and check it is refused InvalidBSON for its depth. Frees b. */
static void refused_on_small_stack(mbuf *b)
{
	wire_msg m;
	uint8_t *keep = NULL;
	char err[256] = "";
	int code = -1;
	deep_arg arg = {b->p, b->len, &m, &keep, &code, err, sizeof err, 0};
	pthread_attr_t attr;
	pthread_t th;

	assert_int_equal(pthread_attr_init(&attr), 0);
	assert_int_equal(pthread_attr_setstacksize(&attr, 256 * 1024), 0);
	assert_int_equal(pthread_create(&th, &attr, deep_parse, &arg), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	pthread_attr_destroy(&attr);
	assert_int_equal(arg.rc, SDB_EPROTO);
	assert_int_equal(code, WIRE_ERR_INVALID_BSON);
	assert_non_null(strstr(err, "deeper than 200 levels"));
	free(keep);
	free(b->p);
}

/* A body nested 20,000 levels deep ({find: "c", let: {v: [[[...]]]}}, about 160 KB) is
 * refused InvalidBSON without recursing through it: bson_validate, which recursed without a
 * limit, overflowed the loop thread's stack and killed the process. */
static void test_deeply_nested_body_is_refused(void **state)
{
	size_t len;
	uint8_t *d = nested(20000, 0x04, '0', &len);
	bson_t *head = BCON_NEW("find", BCON_UTF8("c"));
	mbuf b = msg_begin(4, WIRE_OP_MSG);

	(void)state;
	put_i32(&b, 0);
	put_u8(&b, 0);
	/* body = head's elements + {let: d-as-document} */
	{
		uint32_t hl = wire_bson_len(head);
		int32_t total = (int32_t)(hl - 1 + 1 + 4 + len + 1);
		put_i32(&b, total);
		put(&b, bson_get_data(head) + 4, hl - 5);
		put_u8(&b, 0x03);
		put(&b, "let", 4);
		put(&b, d, len);
		put_u8(&b, 0);
	}
	msg_end(&b);
	refused_on_small_stack(&b);
	free(d);
	bson_destroy(head);
}

/* A body {find: "c", filter: {x: CodeWScope("x", {a: {a: ... {}}})}} whose scope nests
 * 20,000 levels deep is refused InvalidBSON without recursing through it: the scope is a
 * document that bson_validate recursed into without a limit (a 100,000-deep one killed a
 * shard through one message). */
static void test_deeply_nested_scope_is_refused(void **state)
{
	size_t len;
	uint8_t *d = nested(20000, 0x03, 'a', &len);
	mbuf b = msg_begin(5, WIRE_OP_MSG);

	(void)state;
	put_i32(&b, 0);
	put_u8(&b, 0);
	{
		/* code-with-scope value: int32 total, string "x", scope */
		int32_t cws = (int32_t)(4 + 4 + 2 + len);
		int32_t filter = (int32_t)(4 + 1 + 2 + cws + 1);
		int32_t body = (int32_t)(4 + (1 + 5 + 4 + 2) + (1 + 7 + filter) + 1);
		put_i32(&b, body);
		put_u8(&b, 0x02);
		put(&b, "find", 5);
		put_i32(&b, 2);
		put(&b, "c", 2);
		put_u8(&b, 0x03);
		put(&b, "filter", 7);
		put_i32(&b, filter);
		put_u8(&b, 0x0f);
		put(&b, "x", 2);
		put_i32(&b, cws);
		put_i32(&b, 2);
		put(&b, "x", 2);
		put(&b, d, len);
		put_u8(&b, 0);
		put_u8(&b, 0);
	}
	msg_end(&b);
	refused_on_small_stack(&b);
	free(d);
}

static void test_op_query(void **state)
{
	bson_t *q = BCON_NEW("isMaster", BCON_INT32(1), "helloOk", BCON_BOOL(true));
	bson_t *fields = BCON_NEW("x", BCON_INT32(1));
	bson_t *wrapped = BCON_NEW("$query", "{", "ping", BCON_INT32(1), "}", "$readPreference",
				   "{", "mode", BCON_UTF8("primary"), "}");

	(void)state;
	for (int variant = 0; variant < 3; variant++) {
		mbuf b = msg_begin(11, WIRE_OP_QUERY);
		wire_msg m;
		bson_t cmd;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;

		put_i32(&b, 4); /* flags: SecondaryOk */
		put(&b, "admin.$cmd", 11);
		put_i32(&b, 0);
		put_i32(&b, -1);
		put_doc(&b, variant == 2 ? wrapped : q);
		if (variant == 1)
			put_doc(&b, fields);
		msg_end(&b);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
		assert_int_equal(m.hdr.op_code, 2004);
		assert_int_equal(m.hdr.request_id, 11);
		assert_int_equal(m.query_flags, 4);
		assert_string_equal(m.full_collection_name, "admin.$cmd");
		assert_int_equal(m.number_to_skip, 0);
		assert_int_equal(m.number_to_return, -1);
		assert_int_equal(m.has_fields, variant == 1);
		if (variant == 1)
			assert_doc_json(&m.fields, "{ \"x\" : 1 }");
		bson_init(&cmd);
	assert_int_equal(wire_msg_command(&m, &cmd, &code, err, sizeof err), 0);
		if (variant == 2)
			assert_doc_json(&cmd, "{ \"ping\" : 1 }");
		else
			assert_doc_json(&cmd, "{ \"isMaster\" : 1, \"helloOk\" : true }");
		bson_destroy(&cmd);
		free(keep);

		/* every truncation (length patched) fails, except the one that drops the
		 * optional returnFieldsSelector exactly */
		for (size_t l = 16; l < b.len; l++) {
			int rc;
			set_i32(&b, 0, (int32_t)l);
			rc = parse_copy(b.p, l, &m, &keep, &code, err, sizeof err);
			if (variant == 1 && l == b.len - wire_bson_len(fields))
				assert_int_equal(rc, 0);
			else
				assert_int_equal(rc, SDB_EPROTO);
			free(keep);
		}
		free(b.p);
	}
	/* trailing garbage after the selector */
	{
		mbuf b = msg_begin(11, WIRE_OP_QUERY);
		wire_msg m;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;
		put_i32(&b, 0);
		put(&b, "admin.$cmd", 11);
		put_i32(&b, 0);
		put_i32(&b, -1);
		put_doc(&b, q);
		put_doc(&b, fields);
		put_u8(&b, 7);
		msg_end(&b);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err),
				 SDB_EPROTO);
		free(keep);
		free(b.p);
	}
	bson_destroy(q);
	bson_destroy(fields);
	bson_destroy(wrapped);
}

/* An OP_QUERY message on ns: flags, skip, ntoreturn, query, optional fields. */
static mbuf build_query(const char *ns, int32_t flags, int32_t skip, int32_t ntoreturn,
			const bson_t *q, const bson_t *fields)
{
	mbuf b = msg_begin(12, WIRE_OP_QUERY);

	put_i32(&b, flags);
	put(&b, ns, strlen(ns) + 1);
	put_i32(&b, skip);
	put_i32(&b, ntoreturn);
	put_doc(&b, q);
	if (fields)
		put_doc(&b, fields);
	msg_end(&b);
	return b;
}

/* wire_msg_legacy_find of one OP_QUERY: its return code; the command as JSON in want
 * (success) or the error's code in *code. */
static int legacy_find(const char *ns, int32_t flags, int32_t skip, int32_t ntoreturn,
		       const bson_t *q, const bson_t *fields, const char *want, int *code,
		       int32_t *batch)
{
	mbuf b = build_query(ns, flags, skip, ntoreturn, q, fields);
	wire_msg m;
	uint8_t *keep;
	char err[256] = "";
	char *db = NULL, *coll = NULL;
	bson_t cmd;
	int rc;

	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, code, err, sizeof err), 0);
	bson_init(&cmd);
	rc = wire_msg_legacy_find(&m, &cmd, &db, &coll, batch, code, err, sizeof err);
	if (rc == 0) {
		assert_doc_json(&cmd, want);
		assert_int_equal(*code, 0);
		assert_string_equal(db, ns[0] == 'd' ? "db" : "x");
		assert_non_null(coll);
		assert_string_equal(coll, strchr(ns, '.') + 1);
	} else {
		assert_null(db);
		assert_null(coll);
		assert_true(err[0] != '\0');
	}
	free(db);
	free(coll);
	bson_destroy(&cmd);
	free(keep);
	free(b.p);
	return rc;
}

static void test_legacy_find(void **state)
{
	bson_t *plain = BCON_NEW("a", BCON_INT32(1));
	bson_t *fields = BCON_NEW("a", BCON_INT32(1));
	bson_t *wrapped = BCON_NEW("$query", "{", "a", BCON_INT32(1), "}", "$orderby", "{", "b",
				   BCON_INT32(-1), "}", "$hint", BCON_UTF8("b_1"), "$comment",
				   BCON_UTF8("c"), "$maxTimeMS", BCON_INT32(100), "$returnKey",
				   BCON_INT32(1), "$showDiskLoc", BCON_BOOL(false), "$min", "{",
				   "b", BCON_INT32(0), "}", "$max", "{", "b", BCON_INT32(9), "}");
	bson_t *query_wrapped = BCON_NEW("query", "{", "a", BCON_INT32(2), "}", "orderby", "{",
					 "a", BCON_INT32(1), "}");
	bson_t *rp = BCON_NEW("$query", "{", "}", "$readPreference", "{", "mode",
			      BCON_UTF8("nearest"), "}");
	bson_t *explain = BCON_NEW("$query", "{", "}", "$explain", BCON_BOOL(true));
	bson_t *bad_sort = BCON_NEW("$query", "{", "}", "$orderby", BCON_UTF8("a"));
	int code;
	int32_t batch;

	(void)state;
	/* the plain case: filter, projection, skip, batchSize */
	assert_int_equal(legacy_find("db.c.sub", 0, 5, 7, plain, fields,
				     "{ \"find\" : \"c.sub\", \"filter\" : { \"a\" : 1 }, "
				     "\"projection\" : { \"a\" : 1 }, \"skip\" : 5, \"batchSize\" : 7, "
				     "\"$db\" : \"db\" }",
				     &code, &batch),
			 0);
	assert_int_equal(batch, 7);
	/* every modifier and every flag; slaveOk -> secondaryPreferred */
	assert_int_equal(
		legacy_find("db.c",
			    WIRE_QUERY_FLAG_TAILABLE | WIRE_QUERY_FLAG_AWAIT_DATA |
				    WIRE_QUERY_FLAG_NO_CURSOR_TIMEOUT | WIRE_QUERY_FLAG_PARTIAL |
				    WIRE_QUERY_FLAG_SLAVE_OK | WIRE_QUERY_FLAG_EXHAUST,
			    0, 0, wrapped, NULL,
			    "{ \"find\" : \"c\", \"filter\" : { \"a\" : 1 }, \"sort\" : { \"b\" : -1 }, "
			    "\"hint\" : \"b_1\", \"comment\" : \"c\", \"maxTimeMS\" : 100, "
			    "\"returnKey\" : true, \"showRecordId\" : false, \"min\" : { \"b\" : 0 }, "
			    "\"max\" : { \"b\" : 9 }, \"tailable\" : true, \"awaitData\" : true, "
			    "\"noCursorTimeout\" : true, \"allowPartialResults\" : true, "
			    "\"$readPreference\" : { \"mode\" : \"secondaryPreferred\" }, "
			    "\"$db\" : \"db\" }",
			    &code, &batch),
		0);
	assert_int_equal(batch, 0);
	/* mongod's other wrapper, `query` (and `orderby`); ntoreturn -3: limit, single batch */
	assert_int_equal(legacy_find("db.c", 0, 0, -3, query_wrapped, NULL,
				     "{ \"find\" : \"c\", \"filter\" : { \"a\" : 2 }, \"limit\" : 3, "
				     "\"singleBatch\" : true, \"sort\" : { \"a\" : 1 }, "
				     "\"$db\" : \"db\" }",
				     &code, &batch),
			 0);
	/* ntoreturn 1 is -1; INT32_MIN cannot be negated */
	assert_int_equal(legacy_find("db.c", 0, 0, 1, plain, NULL,
				     "{ \"find\" : \"c\", \"filter\" : { \"a\" : 1 }, \"limit\" : 1, "
				     "\"singleBatch\" : true, \"$db\" : \"db\" }",
				     &code, &batch),
			 0);
	assert_int_equal(legacy_find("db.c", 0, 0, INT32_MIN, plain, NULL,
				     "{ \"find\" : \"c\", \"filter\" : { \"a\" : 1 }, "
				     "\"limit\" : 2147483647, \"singleBatch\" : true, \"$db\" : \"db\" }",
				     &code, &batch),
			 0);
	/* an explicit $readPreference wins over slaveOk */
	assert_int_equal(legacy_find("db.c", WIRE_QUERY_FLAG_SLAVE_OK, 0, 0, rp, NULL,
				     "{ \"find\" : \"c\", \"filter\" : {  }, "
				     "\"$readPreference\" : { \"mode\" : \"nearest\" }, \"$db\" : \"db\" }",
				     &code, &batch),
			 0);
	/* errors */
	assert_int_equal(legacy_find("db.", 0, 0, 0, plain, NULL, NULL, &code, &batch),
			 SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_INVALID_NAMESPACE);
	assert_int_equal(legacy_find(".c", 0, 0, 0, plain, NULL, NULL, &code, &batch), SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_INVALID_NAMESPACE);
	assert_int_equal(legacy_find("db", 0, 0, 0, plain, NULL, NULL, &code, &batch), SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_INVALID_NAMESPACE);
	assert_int_equal(legacy_find("db.c", 0, -1, 0, plain, NULL, NULL, &code, &batch),
			 SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_BAD_VALUE);
	assert_int_equal(legacy_find("db.c", 0, 0, 0, explain, NULL, NULL, &code, &batch),
			 SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_BAD_VALUE);
	assert_int_equal(legacy_find("db.c", 0, 0, 0, bad_sort, NULL, NULL, &code, &batch),
			 SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_BAD_VALUE);
	assert_int_equal(legacy_find("db.c", WIRE_QUERY_FLAG_EXHAUST | WIRE_QUERY_FLAG_TAILABLE, 0,
				     0, plain, NULL, NULL, &code, &batch),
			 SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_BAD_VALUE);
	bson_destroy(plain);
	bson_destroy(fields);
	bson_destroy(wrapped);
	bson_destroy(query_wrapped);
	bson_destroy(rp);
	bson_destroy(explain);
	bson_destroy(bad_sort);
}

static void test_op_get_more(void **state)
{
	mbuf b = msg_begin(13, WIRE_OP_GET_MORE);
	wire_msg m;
	uint8_t *keep;
	char err[256] = "";
	char *db = NULL, *coll = NULL;
	int code = -1;
	bson_t cmd;

	(void)state;
	put_i32(&b, 0);
	put(&b, "db.c", 5);
	put_i32(&b, -40);
	put_i32(&b, 0x01020304); /* cursorID 0x0000000501020304, little-endian */
	put_i32(&b, 5);
	msg_end(&b);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
	assert_int_equal(m.hdr.op_code, 2005);
	assert_string_equal(m.full_collection_name, "db.c");
	assert_int_equal(m.number_to_return, -40);
	assert_true(m.cursor_id == 0x0000000501020304LL);
	bson_init(&cmd);
	assert_int_equal(wire_msg_legacy_get_more_cmd(&m, &cmd, &db, &coll, &code, err, sizeof err),
			 0);
	assert_doc_json(&cmd, "{ \"getMore\" : 21491745540, \"collection\" : \"c\", "
			      "\"batchSize\" : 40, \"$db\" : \"db\" }");
	assert_string_equal(db, "db");
	assert_string_equal(coll, "c");
	free(db);
	free(coll);
	bson_destroy(&cmd);
	free(keep);
	/* every truncation and one trailing byte fail */
	for (size_t l = 16; l < b.len; l++) {
		set_i32(&b, 0, (int32_t)l);
		assert_int_equal(parse_copy(b.p, l, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
		assert_int_equal(code, WIRE_ERR_PROTOCOL_ERROR);
		free(keep);
	}
	put_u8(&b, 0);
	msg_end(&b);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
	free(keep);
	free(b.p);
	/* a namespace without a collection */
	b = msg_begin(14, WIRE_OP_GET_MORE);
	put_i32(&b, 0);
	put(&b, "db", 3);
	put_i32(&b, 0);
	put_i32(&b, 1);
	put_i32(&b, 0);
	msg_end(&b);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
	bson_init(&cmd);
	assert_int_equal(wire_msg_legacy_get_more_cmd(&m, &cmd, &db, &coll, &code, err, sizeof err),
			 SDB_EINVAL);
	assert_int_equal(code, WIRE_ERR_INVALID_NAMESPACE);
	assert_null(db);
	bson_destroy(&cmd);
	free(keep);
	free(b.p);
}

/* An OP_REPLY's header fields and documents. */
static void read_reply(const uint8_t *p, size_t len, int32_t *flags, int64_t *cursor_id,
		       int32_t *starting_from, int32_t *n)
{
	assert_true(len >= 36);
	assert_int_equal(wire_msg_peek_length(p), (int32_t)len);
	assert_int_equal(p[12], 1);
	memcpy(flags, p + 16, 4);
	memcpy(cursor_id, p + 20, 8);
	memcpy(starting_from, p + 28, 4);
	memcpy(n, p + 32, 4);
}

static void test_encode_cursor_reply(void **state)
{
	bson_t *first = BCON_NEW("cursor", "{", "firstBatch", "[", "{", "_id", BCON_INT32(1), "}",
				 "{", "_id", BCON_INT32(2), "}", "]", "id", BCON_INT64(77), "ns",
				 BCON_UTF8("db.c"), "}", "ok", BCON_DOUBLE(1.0));
	bson_t *next = BCON_NEW("cursor", "{", "id", BCON_INT64(0), "nextBatch", "[", "{", "_id",
				BCON_INT32(3), "}", "]", "}", "ok", BCON_DOUBLE(1.0));
	bson_t *fail = BCON_NEW("ok", BCON_DOUBLE(0.0), "errmsg", BCON_UTF8("bad"), "code",
				BCON_INT32(2), "codeName", BCON_UTF8("BadValue"));
	bson_t *gone = BCON_NEW("ok", BCON_DOUBLE(0.0), "errmsg", BCON_UTF8("cursor id 5 not found"),
				"code", BCON_INT32(43));
	bson_t *shapeless = BCON_NEW("ok", BCON_DOUBLE(1.0));
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1)), *d2 = BCON_NEW("_id", BCON_INT32(2));
	int32_t flags, from, n, nret;
	int64_t id, cid;
	size_t len;
	uint8_t *p;
	bson_t doc;

	(void)state;
	p = wire_msg_encode_cursor_reply(5, 6, WIRE_REPLY_FLAG_AWAIT_CAPABLE, 0, first, &cid,
					 &nret, &len);
	read_reply(p, len, &flags, &id, &from, &n);
	assert_int_equal(flags, WIRE_REPLY_FLAG_AWAIT_CAPABLE);
	assert_true(id == 77 && cid == 77);
	assert_int_equal(from, 0);
	assert_int_equal(n, 2);
	assert_int_equal(nret, 2);
	assert_int_equal(p[4], 5);
	assert_int_equal(p[8], 6);
	assert_int_equal(len, 36 + wire_bson_len(d1) + wire_bson_len(d2));
	assert_memory_equal(p + 36, bson_get_data(d1), wire_bson_len(d1));
	assert_memory_equal(p + 36 + wire_bson_len(d1), bson_get_data(d2), wire_bson_len(d2));
	free(p);

	p = wire_msg_encode_cursor_reply(7, 8, 0, 2, next, &cid, &nret, &len);
	read_reply(p, len, &flags, &id, &from, &n);
	assert_true(id == 0 && cid == 0);
	assert_int_equal(from, 2);
	assert_int_equal(n, 1);
	free(p);

	/* a failure: one {$err, ...} document, QueryFailure, cursorID 0 */
	p = wire_msg_encode_cursor_reply(9, 10, WIRE_REPLY_FLAG_AWAIT_CAPABLE, 4, fail, &cid, &nret,
					 &len);
	read_reply(p, len, &flags, &id, &from, &n);
	assert_int_equal(flags, WIRE_REPLY_FLAG_AWAIT_CAPABLE | WIRE_REPLY_FLAG_QUERY_FAILURE);
	assert_true(id == 0 && cid == 0);
	assert_int_equal(n, 1);
	assert_true(bson_init_static(&doc, p + 36, len - 36));
	assert_doc_json(&doc, "{ \"$err\" : \"bad\", \"ok\" : 0.0, \"errmsg\" : \"bad\", "
			      "\"code\" : 2, \"codeName\" : \"BadValue\" }");
	free(p);

	/* an unknown cursor: CursorNotFound, no document (mongod's OP_GET_MORE answer) */
	p = wire_msg_encode_cursor_reply(11, 12, 0, 0, gone, &cid, &nret, &len);
	read_reply(p, len, &flags, &id, &from, &n);
	assert_int_equal(flags, WIRE_REPLY_FLAG_CURSOR_NOT_FOUND);
	assert_int_equal(n, 0);
	assert_int_equal(nret, 0);
	assert_int_equal(len, 36);
	free(p);

	/* ok but no cursor: never sent as a success */
	p = wire_msg_encode_cursor_reply(13, 14, 0, 0, shapeless, &cid, &nret, &len);
	read_reply(p, len, &flags, &id, &from, &n);
	assert_int_equal(flags, WIRE_REPLY_FLAG_QUERY_FAILURE);
	assert_true(bson_init_static(&doc, p + 36, len - 36));
	assert_int_equal(n, 1);
	{
		bson_iter_t it;
		assert_true(bson_iter_init_find(&it, &doc, "$err") && BSON_ITER_HOLDS_UTF8(&it));
		assert_true(bson_iter_init_find(&it, &doc, "code") &&
			    bson_iter_int32(&it) == WIRE_ERR_INTERNAL);
	}
	free(p);

	/* a plain OP_REPLY of a failed command gets $err too; code and ok added if missing */
	{
		bson_t *bare = BCON_NEW("errmsg", BCON_UTF8("x"));
		p = wire_msg_encode_reply(15, 16, WIRE_REPLY_FLAG_QUERY_FAILURE, bare, &len);
		assert_true(bson_init_static(&doc, p + 36, len - 36));
		assert_doc_json(&doc, "{ \"$err\" : \"x\", \"errmsg\" : \"x\", \"code\" : 8, "
				      "\"ok\" : 0.0 }");
		free(p);
		p = wire_msg_encode_reply(15, 16, 0, fail, &len);
		assert_int_equal(p[16], 0); /* flags as given: a command's reply */
		assert_true(bson_init_static(&doc, p + 36, len - 36));
		assert_doc_json(&doc, "{ \"$err\" : \"bad\", \"ok\" : 0.0, \"errmsg\" : \"bad\", "
				      "\"code\" : 2, \"codeName\" : \"BadValue\" }");
		free(p);
		bson_destroy(bare);
	}
	bson_destroy(first);
	bson_destroy(next);
	bson_destroy(fail);
	bson_destroy(gone);
	bson_destroy(shapeless);
	bson_destroy(d1);
	bson_destroy(d2);
}

static void test_op_compressed_and_unknown_opcode(void **state)
{
	mbuf b = msg_begin(21, WIRE_OP_COMPRESSED);
	wire_msg m;
	uint8_t *keep;
	char err[256] = "";
	int code = -1;

	(void)state;
	put_i32(&b, WIRE_OP_MSG);
	put_i32(&b, 100);
	put_u8(&b, 2); /* zlib */
	put(&b, "xxxx", 4);
	msg_end(&b);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
	assert_int_equal(m.hdr.op_code, 2012);
	assert_int_equal(m.original_op_code, 2013);
	assert_int_equal(m.uncompressed_size, 100);
	assert_int_equal(m.compressor_id, 2);
	free(keep);
	/* truncated OP_COMPRESSED header */
	set_i32(&b, 0, 20);
	assert_int_equal(parse_copy(b.p, 20, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
	free(keep);
	/* OP_INSERT (2002) was removed in MongoDB 6.0 */
	set_i32(&b, 0, (int32_t)b.len);
	set_i32(&b, 12, 2002);
	assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), SDB_EPROTO);
	assert_string_equal(err, "unsupported opCode 2002");
	assert_int_equal(m.hdr.request_id, 21); /* header known even on failure */
	free(keep);
	free(b.p);
}

static void test_command_fold_errors(void **state)
{
	bson_t *body = BCON_NEW("insert", BCON_UTF8("c"), "documents", "[", "]", "$db",
				BCON_UTF8("t"));
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1));
	const char *ids[] = {"documents", ""};
	const char *want[] = {"Duplicate field between body and document sequence documents",
			      "empty identifier"};

	(void)state;
	for (int i = 0; i < 2; i++) {
		mbuf b = msg_begin(3, WIRE_OP_MSG);
		wire_msg m;
		bson_t cmd;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;

		put_i32(&b, 0);
		put_u8(&b, 0);
		put_doc(&b, body);
		put_u8(&b, 1);
		put_seq(&b, ids[i], &d1, 1);
		msg_end(&b);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
		bson_init(&cmd);
	assert_int_equal(wire_msg_command(&m, &cmd, &code, err, sizeof err), SDB_EPROTO);
		assert_non_null(strstr(err, want[i]));
		/* mongod's op_msg.cpp assertion 40433 (codeName Location40433) */
		assert_int_equal(code, i == 0 ? 40433 : WIRE_ERR_BAD_VALUE);
		bson_destroy(&cmd);
		free(keep);
		free(b.p);
	}
	/* two sequences of one name: 40431, before the body is looked at (mongod refuses it as
	 * it reads the sections, and the body's `documents` after) */
	{
		mbuf b = msg_begin(3, WIRE_OP_MSG);
		wire_msg m;
		bson_t cmd;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;

		put_i32(&b, 0);
		put_u8(&b, 1);
		put_seq(&b, "documents", &d1, 1);
		put_u8(&b, 0);
		put_doc(&b, body);
		put_u8(&b, 1);
		put_seq(&b, "documents", &d1, 1);
		msg_end(&b);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
		bson_init(&cmd);
		assert_int_equal(wire_msg_command(&m, &cmd, &code, err, sizeof err), SDB_EPROTO);
		assert_string_equal(err, "Duplicate document sequence: documents");
		assert_int_equal(code, 40431);
		bson_destroy(&cmd);
		free(keep);
		free(b.p);
	}
	/* two sequences, one empty: both folded, in order */
	{
		bson_t *ping = BCON_NEW("bulk", BCON_INT32(1), "$db", BCON_UTF8("t"));
		mbuf b = msg_begin(3, WIRE_OP_MSG);
		wire_msg m;
		bson_t cmd;
		uint8_t *keep;
		char err[256] = "";
		int code = -1;

		put_i32(&b, 0);
		put_u8(&b, 1);
		put_seq(&b, "ops", &d1, 1);
		put_u8(&b, 0);
		put_doc(&b, ping);
		put_u8(&b, 1);
		put_seq(&b, "nsInfo", NULL, 0);
		msg_end(&b);
		assert_int_equal(parse_copy(b.p, b.len, &m, &keep, &code, err, sizeof err), 0);
		assert_int_equal(m.n_seqs, 2);
		assert_int_equal(m.seqs[1].n_docs, 0);
		bson_init(&cmd);
	assert_int_equal(wire_msg_command(&m, &cmd, &code, err, sizeof err), 0);
		assert_doc_json(&cmd, "{ \"bulk\" : 1, \"$db\" : \"t\", \"ops\" : [ { \"_id\" : 1 } "
				      "], \"nsInfo\" : [  ] }");
		bson_destroy(&cmd);
		free(keep);
		free(b.p);
		bson_destroy(ping);
	}
	bson_destroy(body);
	bson_destroy(d1);
}

static void test_encode_round_trip(void **state)
{
	bson_t *body = BCON_NEW("ok", BCON_DOUBLE(1.0), "n", BCON_INT32(3));
	wire_msg m;
	uint8_t *p;
	size_t len;
	char err[256] = "";
	int code = -1;

	(void)state;
	p = wire_msg_encode_msg(7, 42, WIRE_MSG_FLAG_MORE_TO_COME | WIRE_MSG_FLAG_CHECKSUM_PRESENT,
				body, &len);
	assert_int_equal(len, 16 + 4 + 1 + wire_bson_len(body));
	assert_int_equal(wire_msg_parse(p, len, &m, &code, err, sizeof err), 0);
	assert_int_equal(m.hdr.message_length, (int32_t)len);
	assert_int_equal(m.hdr.request_id, 7);
	assert_int_equal(m.hdr.response_to, 42);
	assert_int_equal(m.hdr.op_code, 2013);
	assert_int_equal(m.flags, WIRE_MSG_FLAG_MORE_TO_COME); /* checksum bit never set */
	assert_true(bson_equal(&m.body, body));
	free(p);

	p = wire_msg_encode_reply(8, 43, WIRE_REPLY_FLAG_AWAIT_CAPABLE, body, &len);
	assert_int_equal(len, 36 + wire_bson_len(body));
	assert_int_equal(wire_msg_peek_length(p), (int32_t)len);
	assert_int_equal(p[4], 8);
	assert_int_equal(p[8], 43);
	assert_int_equal(p[12], 1); /* OP_REPLY */
	assert_int_equal(p[13] | p[14] | p[15], 0);
	assert_int_equal(p[16], 8);  /* responseFlags AwaitCapable */
	for (int i = 20; i < 32; i++) /* cursorID 0, startingFrom 0 */
		assert_int_equal(p[i], 0);
	assert_int_equal(p[32], 1); /* numberReturned */
	assert_memory_equal(p + 36, bson_get_data(body), wire_bson_len(body));
	free(p);
	bson_destroy(body);
}

static void test_code_names(void **state)
{
	(void)state;
	assert_string_equal(wire_code_name(WIRE_ERR_COMMAND_NOT_FOUND), "CommandNotFound");
	assert_string_equal(wire_code_name(WIRE_ERR_BAD_VALUE), "BadValue");
	assert_string_equal(wire_code_name(WIRE_ERR_BSON_TOO_LARGE), "BSONObjectTooLarge");
	assert_string_equal(wire_code_name(WIRE_ERR_NOT_WRITABLE_PRIMARY), "NotWritablePrimary");
	assert_string_equal(wire_code_name(WIRE_ERR_STALE_CONFIG), "StaleConfig");
	assert_string_equal(wire_code_name(WIRE_ERR_DUPLICATE_KEY), "DuplicateKey");
	assert_string_equal(wire_code_name(WIRE_ERR_RATE_LIMITED),
			    "IngressRequestRateLimitExceeded");
	assert_string_equal(wire_code_name(WIRE_ERR_PROTOCOL_ERROR), "ProtocolError");
	/* the IDL parsers' codes, named in mongod's error_codes.yml */
	assert_string_equal(wire_code_name(40413), "IDLDuplicateField");
	assert_string_equal(wire_code_name(40414), "IDLFailedToParse");
	assert_string_equal(wire_code_name(40415), "IDLUnknownField");
	/* mongod: codes without an ErrorCodes name are "Location<code>" */
	assert_string_equal(wire_code_name(31254), "Location31254");
	assert_string_equal(wire_code_name(15975), "Location15975");
	assert_string_equal(wire_code_name(8), "UnknownError");
	assert_string_equal(wire_code_name(-3), "UnknownError");
}


/* read_doc and read_cstring (statics of msg.c, reachable because the test includes it): a
 * document's length field is checked against the bytes left in its container before the
 * document is used (never trust a length from the network), each refusal with its code,
 * and a C string is looked for only inside the bytes given. */
static void test_static_read_doc_and_cstring(void **state)
{
	uint8_t buf[64];
	bson_t doc, *src = BCON_NEW("a", BCON_INT32(1)); /* 12 bytes */
	size_t used = 0;
	int code = 0;
	char err[256];

	(void)state;
	assert_int_equal(src->len, 12);
	memset(buf, 0xee, sizeof buf);
	memcpy(buf, bson_get_data(src), src->len);

	/* inside a 64-byte container: used is the document's own 12 bytes */
	assert_int_equal(read_doc(buf, sizeof buf, "body", &doc, &used, &code, err, sizeof err), 0);
	assert_int_equal(used, 12);
	assert_int_equal(doc.len, 12);
	assert_true(bson_has_field(&doc, "a"));

	/* fewer than 5 bytes left: not even a length field and a terminator */
	assert_int_equal(read_doc(buf, 4, "body", &doc, &used, &code, err, sizeof err), SDB_EPROTO);
	assert_int_equal(code, WIRE_ERR_INVALID_BSON);
	assert_string_equal(err, "body: truncated document (4 bytes left)");

	/* the length field (12) is one more than the bytes left */
	code = 0;
	assert_int_equal(read_doc(buf, 11, "section", &doc, &used, &code, err, sizeof err),
			 SDB_EPROTO);
	assert_int_equal(code, WIRE_ERR_INVALID_BSON);
	assert_string_equal(err, "section: document length 12 exceeds the 11 bytes left");

	/* below the 5-byte minimum, and negative (must not become a huge size_t) */
	wr_i32(buf, 4);
	code = 0;
	assert_int_equal(read_doc(buf, sizeof buf, "body", &doc, &used, &code, err, sizeof err),
			 SDB_EPROTO);
	assert_int_equal(code, WIRE_ERR_INVALID_BSON);
	assert_string_equal(err, "body: invalid document length 4");
	wr_i32(buf, -1);
	assert_int_equal(read_doc(buf, sizeof buf, "body", &doc, &used, &code, err, sizeof err),
			 SDB_EPROTO);
	assert_string_equal(err, "body: invalid document length -1");

	/* over maxBsonObjectSize: refused as too large (its own code) before the bytes-left
	 * check, whatever the container holds */
	wr_i32(buf, WIRE_MAX_BSON_SIZE + 1);
	code = 0;
	assert_int_equal(read_doc(buf, sizeof buf, "body", &doc, &used, &code, err, sizeof err),
			 SDB_ETOOBIG);
	assert_int_equal(code, WIRE_ERR_BSON_TOO_LARGE);
	assert_non_null(strstr(err, "over maxBsonObjectSize 16777216"));

	/* right length, but the last byte is not the terminating NUL */
	wr_i32(buf, 12);
	buf[11] = 1;
	code = 0;
	assert_int_equal(read_doc(buf, sizeof buf, "body", &doc, &used, &code, err, sizeof err),
			 SDB_EPROTO);
	assert_int_equal(code, WIRE_ERR_INVALID_BSON);
	assert_string_equal(err, "body: invalid document");

	/* read_cstring: the length up to the NUL, or -1 when the NUL lies past avail */
	assert_int_equal(read_cstring((const uint8_t *)"db.c\0xyz", 8), 4);
	assert_int_equal(read_cstring((const uint8_t *)"\0", 1), 0);
	assert_int_equal(read_cstring((const uint8_t *)"db.c\0", 4), -1);
	assert_int_equal(read_cstring((const uint8_t *)"db.c\0", 0), -1);
	bson_destroy(src);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_op_msg_body_and_sequence),
		cmocka_unit_test(test_op_msg_flags),
		cmocka_unit_test(test_crc32c),
		cmocka_unit_test(test_checksum),
		cmocka_unit_test(test_truncated_every_length),
		cmocka_unit_test(test_wrong_lengths),
		cmocka_unit_test(test_oversize_body),
		cmocka_unit_test(test_sections_errors),
		cmocka_unit_test(test_invalid_nested_bson),
		cmocka_unit_test(test_deeply_nested_body_is_refused),
		cmocka_unit_test(test_deeply_nested_scope_is_refused),
		cmocka_unit_test(test_op_query),
		cmocka_unit_test(test_legacy_find),
		cmocka_unit_test(test_op_get_more),
		cmocka_unit_test(test_encode_cursor_reply),
		cmocka_unit_test(test_op_compressed_and_unknown_opcode),
		cmocka_unit_test(test_command_fold_errors),
		cmocka_unit_test(test_encode_round_trip),
		cmocka_unit_test(test_code_names),
		cmocka_unit_test(test_static_read_doc_and_cstring),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
