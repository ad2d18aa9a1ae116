/* Change stream resume tokens: encoding, decoding and order (see changestream.h for the
 * byte layout). */
#include "common/changestream.h"

#include <stdio.h>
#include <string.h>

#include "common/err.h"

#define TOKEN_VERSION 1
#define TOKEN_MAX (1 + 8 + 1 + 1 + SDB_CS_SHARD_MAX + 4)

void sdb_cs_token_append(bson_t *out, const char *name, const sdb_cs_token *t)
{
	static const char hexd[] = "0123456789ABCDEF";
	uint8_t b[TOKEN_MAX];
	char hex[2 * TOKEN_MAX + 1];
	size_t n = 0, sl = strnlen(t->shard, SDB_CS_SHARD_MAX), i;
	bson_t sub;

	b[n++] = TOKEN_VERSION;
	for (i = 0; i < 8; i++)
		b[n++] = (uint8_t)(t->ts >> (56 - 8 * i));
	b[n++] = t->kind;
	b[n++] = (uint8_t)sl;
	memcpy(b + n, t->shard, sl);
	n += sl;
	for (i = 0; i < 4; i++)
		b[n++] = (uint8_t)(t->idx >> (24 - 8 * i));
	for (i = 0; i < n; i++) {
		hex[2 * i] = hexd[b[i] >> 4];
		hex[2 * i + 1] = hexd[b[i] & 15];
	}
	hex[2 * n] = '\0';
	bson_append_document_begin(out, name, -1, &sub);
	BSON_APPEND_UTF8(&sub, "_data", hex);
	bson_append_document_end(out, &sub);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

static int fail(int *code, int c, char *err, size_t errlen, const char *msg)
{
	if (code)
		*code = c;
	return sdb_errf(err, errlen, SDB_EINVAL, "%s", msg);
}

int sdb_cs_token_parse_code(const bson_t *doc, sdb_cs_token *t, int *code, char *err,
			    size_t errlen)
{
	uint8_t b[TOKEN_MAX];
	bson_iter_t it;
	const char *hex;
	uint32_t len, n, i, sl;

	if (!doc || !bson_iter_init_find(&it, doc, "_data") || !BSON_ITER_HOLDS_UTF8(&it))
		return fail(code, 40647, err, errlen,
			    "Bad resume token: _data of missing or of wrong type. Expected string");
	hex = bson_iter_utf8(&it, &len);
	if (len % 2 != 0)
		return fail(code, 9, err, errlen,
			    "resume token string was not a valid hex string");
	for (i = 0; i < len; i++)
		if (hexval(hex[i]) < 0)
			return fail(code, 9, err, errlen,
				    "resume token string was not a valid hex string");
	n = len / 2;
	if (n < 15 || n > TOKEN_MAX)
		return fail(code, 9, err, errlen, "Bad resume token: wrong length");
	for (i = 0; i < n; i++)
		b[i] = (uint8_t)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
	if (b[0] != TOKEN_VERSION)
		return fail(code, 9, err, errlen, "Bad resume token: unsupported version");
	memset(t, 0, sizeof(*t));
	for (i = 0; i < 8; i++)
		t->ts = t->ts << 8 | b[1 + i];
	t->kind = b[9];
	sl = b[10];
	if (t->kind > SDB_CS_HWM)
		return fail(code, 9, err, errlen, "Bad resume token: unknown token kind");
	if (sl > SDB_CS_SHARD_MAX || n != 15 + sl)
		return fail(code, 9, err, errlen, "Bad resume token: wrong length");
	if (memchr(b + 11, '\0', sl))
		return fail(code, 9, err, errlen, "Bad resume token: bad shard id");
	memcpy(t->shard, b + 11, sl);
	t->shard[sl] = '\0';
	for (i = 0; i < 4; i++)
		t->idx = t->idx << 8 | b[11 + sl + i];
	if (t->kind == SDB_CS_HWM && (sl != 0 || t->idx != 0))
		return fail(code, 9, err, errlen, "Invalid high water mark token");
	return 0;
}

int sdb_cs_token_parse(const bson_t *doc, sdb_cs_token *t, char *err, size_t errlen)
{
	return sdb_cs_token_parse_code(doc, t, NULL, err, errlen);
}

int sdb_cs_token_cmp(const sdb_cs_token *a, const sdb_cs_token *b)
{
	int ah = a->kind == SDB_CS_HWM, bh = b->kind == SDB_CS_HWM, c;

	if (a->ts != b->ts)
		return a->ts < b->ts ? -1 : 1;
	if (ah != bh)
		return ah ? 1 : -1;
	c = strncmp(a->shard, b->shard, SDB_CS_SHARD_MAX);
	if (c)
		return c < 0 ? -1 : 1;
	if (a->idx != b->idx)
		return a->idx < b->idx ? -1 : 1;
	if (a->kind != b->kind)
		return a->kind < b->kind ? -1 : 1;
	return 0;
}

int sdb_cs_check_id(const bson_t *event, const bson_t *out, char *err, size_t errlen)
{
	bson_iter_t ia, ib;
	bool have_a = bson_iter_init_find(&ia, event, "_id");
	bool have_b = bson_iter_init_find(&ib, out, "_id");

	if (have_a && have_b && bson_iter_type(&ia) == bson_iter_type(&ib) &&
	    BSON_ITER_HOLDS_DOCUMENT(&ia)) {
		uint32_t la, lb;
		const uint8_t *da, *db;

		bson_iter_document(&ia, &la, &da);
		bson_iter_document(&ib, &lb, &db);
		if (la == lb && memcmp(da, db, la) == 0)
			return 0;
	}
	bson_t w = BSON_INITIALIZER, g = BSON_INITIALIZER;
	if (have_a)
		bson_append_iter(&w, "_id", 3, &ia);
	if (have_b)
		bson_append_iter(&g, "_id", 3, &ib);
	char *want = bson_as_relaxed_extended_json(&w, NULL);
	char *got = bson_as_relaxed_extended_json(&g, NULL);
	sdb_errf(err, errlen, SDB_EINVAL,
		 "Encountered an event whose _id field, which contains the resume token, was "
		 "modified by the pipeline. Modifying the _id field of an event makes it "
		 "impossible to resume the stream from that point. Only transformations that "
		 "retain the unmodified _id field are allowed. Expected: %s but found: %s",
		 want ? want : "{}", got ? got : "{}");
	bson_free(want);
	bson_free(got);
	bson_destroy(&w);
	bson_destroy(&g);
	return SDB_EINVAL;
}
