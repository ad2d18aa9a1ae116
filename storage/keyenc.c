/* Order-preserving key encoding: byte layout in keyenc.h. */
#include "storage/keyenc.h"

#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/collation.h"

void sdb_key_init(sdb_key *k)
{
	k->data = NULL;
	k->len = 0;
	k->cap = 0;
}

void sdb_key_reset(sdb_key *k)
{
	k->len = 0;
}

void sdb_key_free(sdb_key *k)
{
	free(k->data);
	sdb_key_init(k);
}

static void key_reserve(sdb_key *k, size_t extra)
{
	size_t need = k->len + extra;
	size_t cap;

	if (need <= k->cap)
		return;
	cap = k->cap ? k->cap : 32;
	while (cap < need)
		cap *= 2;
	k->data = sdb_realloc(k->data, cap);
	k->cap = cap;
}

void sdb_key_append(sdb_key *k, const void *bytes, size_t n)
{
	if (n == 0)
		return;
	key_reserve(k, n);
	memcpy(k->data + k->len, bytes, n);
	k->len += n;
}

static void put_byte(sdb_key *k, uint8_t b)
{
	key_reserve(k, 1);
	k->data[k->len++] = b;
}

static void put_be32(sdb_key *k, uint32_t v)
{
	uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};

	sdb_key_append(k, b, 4);
}

static void put_be64(sdb_key *k, uint64_t v)
{
	put_be32(k, (uint32_t)(v >> 32));
	put_be32(k, (uint32_t)v);
}

/* STR: bytes with 0x00 -> 0x00 0xFF, then 0x00 0x00. */
static void put_str(sdb_key *k, const char *s, size_t len)
{
	size_t i, start = 0;

	for (i = 0; i < len; i++) {
		if (s[i] != '\0')
			continue;
		sdb_key_append(k, s + start, i - start + 1);
		put_byte(k, 0xff);
		start = i + 1;
	}
	sdb_key_append(k, s + start, len - start);
	put_byte(k, 0x00);
	put_byte(k, 0x00);
}

uint8_t sdb_keyenc_bracket_byte(int bracket)
{
	switch (bracket) {
	case SDB_BRACKET_MINKEY:
		return 0x0a;
	case SDB_BRACKET_UNDEFINED:
		return 0x0f;
	case SDB_BRACKET_NULL:
		return 0x14;
	case SDB_BRACKET_NUMBER:
		return 0x1e;
	case SDB_BRACKET_STRING:
		return 0x28;
	case SDB_BRACKET_OBJECT:
		return 0x32;
	case SDB_BRACKET_ARRAY:
		return 0x3c;
	case SDB_BRACKET_BINARY:
		return 0x46;
	case SDB_BRACKET_OID:
		return 0x50;
	case SDB_BRACKET_BOOL:
		return 0x5a;
	case SDB_BRACKET_DATE:
		return 0x64;
	case SDB_BRACKET_TIMESTAMP:
		return 0x6e;
	case SDB_BRACKET_REGEX:
		return 0x78;
	case SDB_BRACKET_DBPOINTER:
		return 0x82;
	case SDB_BRACKET_CODE:
		return 0x8c;
	case SDB_BRACKET_CODEWSCOPE:
		return 0x96;
	case SDB_BRACKET_MAXKEY:
	default:
		return 0xf0;
	}
}

static int put_value(sdb_key *k, const bson_value_t *v, int depth, char *err, size_t errlen);

/* the collation of the sdb_keyenc_append_value_coll running on this thread (NULL: none) */
static _Thread_local const sdb_collator *enc_coll;

/* a string under enc_coll: its ICU sort key (no 0x00 inside), then 0x00 0x00 */
static void put_collated(sdb_key *k, const char *s, size_t len)
{
	sdb_collator_sort_key(enc_coll, s, len, k);
	put_byte(k, 0x00);
	put_byte(k, 0x00);
}

static int put_body(sdb_key *k, const bson_value_t *v, int depth, char *err, size_t errlen);

static int put_value(sdb_key *k, const bson_value_t *v, int depth, char *err, size_t errlen)
{
	put_byte(k, sdb_keyenc_bracket_byte(sdb_bson_bracket(v->value_type)));
	return put_body(k, v, depth, err, errlen);
}

/* Elements of an object: BRACKET STR(name) BODY. */
static int put_object(sdb_key *k, const uint8_t *data, size_t len, bool names, int depth,
		      char *err, size_t errlen)
{
	bson_iter_t it;

	if (depth > SDB_BSON_MAX_DEPTH)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"key encoding: document nested deeper than %d levels",
				SDB_BSON_MAX_DEPTH);
	if (!data || !bson_iter_init_from_data(&it, data, len))
		return sdb_errf(err, errlen, SDB_EINVAL, "key encoding: corrupt nested document");
	while (bson_iter_next(&it)) {
		const bson_value_t *ev = bson_iter_value(&it);
		int rc;

		put_byte(k, sdb_keyenc_bracket_byte(sdb_bson_bracket(ev->value_type)));
		if (names)
			put_str(k, bson_iter_key(&it), bson_iter_key_len(&it));
		rc = put_body(k, ev, depth + 1, err, errlen);
		if (rc)
			return rc;
	}
	put_byte(k, 0x00);
	return 0;
}

/* Set while sdb_keyenc_hash_value encodes: numbers then take the frozen pre-exact form
 * (sdb_bson_num_canon_legacy), so that hashes never change (see keyenc.h). */
static _Thread_local bool legacy_numbers;

bool sdb_keyenc_legacy_numbers(bool on)
{
	bool prev = legacy_numbers;

	legacy_numbers = on;
	return prev;
}

static void put_number(sdb_key *k, const bson_value_t *v)
{
	sdb_bson_num n;
	size_t start;

	if (legacy_numbers)
		sdb_bson_num_canon_legacy(v, &n);
	else
		sdb_bson_num_canon(v, &n);
	put_byte(k, (uint8_t)n.cls);
	if (n.cls != 2 && n.cls != 4)
		return;
	start = k->len;
	{
		uint32_t e = (uint32_t)(n.exp + 32768);

		put_byte(k, (uint8_t)(e >> 8));
		put_byte(k, (uint8_t)e);
	}
	put_be64(k, n.frac);
	if (n.frac & 1) {
		/* inexact decimal: DEXP2 then the 34-digit coefficient as 15 bytes */
		uint32_t de = (uint32_t)(n.dexp + 32768);

		put_byte(k, (uint8_t)(de >> 8));
		put_byte(k, (uint8_t)de);
		for (int sh = 48; sh >= 0; sh -= 8)
			put_byte(k, (uint8_t)(n.dhi >> sh));
		put_be64(k, n.dlo);
	}
	if (n.cls == 2) {
		for (size_t i = start; i < k->len; i++)
			k->data[i] ^= 0xff;
	}
}

static int put_body(sdb_key *k, const bson_value_t *v, int depth, char *err, size_t errlen)
{
	switch (v->value_type) {
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_DECIMAL128:
		put_number(k, v);
		return 0;
	case BSON_TYPE_UTF8:
		if (enc_coll)
			put_collated(k, v->value.v_utf8.str, v->value.v_utf8.len);
		else
			put_str(k, v->value.v_utf8.str, v->value.v_utf8.len);
		return 0;
	case BSON_TYPE_SYMBOL:
		if (enc_coll)
			put_collated(k, v->value.v_symbol.symbol, v->value.v_symbol.len);
		else
			put_str(k, v->value.v_symbol.symbol, v->value.v_symbol.len);
		return 0;
	case BSON_TYPE_CODE:
		put_str(k, v->value.v_code.code, v->value.v_code.code_len);
		return 0;
	case BSON_TYPE_DOCUMENT:
		return put_object(k, v->value.v_doc.data, v->value.v_doc.data_len, true, depth, err,
				  errlen);
	case BSON_TYPE_ARRAY:
		return put_object(k, v->value.v_doc.data, v->value.v_doc.data_len, false, depth,
				  err, errlen);
	case BSON_TYPE_BINARY:
		put_be32(k, v->value.v_binary.data_len);
		put_byte(k, (uint8_t)v->value.v_binary.subtype);
		sdb_key_append(k, v->value.v_binary.data, v->value.v_binary.data_len);
		return 0;
	case BSON_TYPE_OID:
		sdb_key_append(k, v->value.v_oid.bytes, 12);
		return 0;
	case BSON_TYPE_BOOL:
		put_byte(k, v->value.v_bool ? 1 : 0);
		return 0;
	case BSON_TYPE_DATE_TIME:
		put_be64(k, (uint64_t)v->value.v_datetime ^ (UINT64_C(1) << 63));
		return 0;
	case BSON_TYPE_TIMESTAMP:
		put_be32(k, v->value.v_timestamp.timestamp);
		put_be32(k, v->value.v_timestamp.increment);
		return 0;
	case BSON_TYPE_REGEX:
		put_str(k, v->value.v_regex.regex, strlen(v->value.v_regex.regex));
		put_str(k, v->value.v_regex.options, strlen(v->value.v_regex.options));
		return 0;
	case BSON_TYPE_DBPOINTER:
		put_be32(k, v->value.v_dbpointer.collection_len);
		sdb_key_append(k, v->value.v_dbpointer.collection,
			       v->value.v_dbpointer.collection_len);
		sdb_key_append(k, v->value.v_dbpointer.oid.bytes, 12);
		return 0;
	case BSON_TYPE_CODEWSCOPE:
		put_str(k, v->value.v_codewscope.code, v->value.v_codewscope.code_len);
		return put_object(k, v->value.v_codewscope.scope_data,
				  v->value.v_codewscope.scope_len, true, depth, err, errlen);
	default: /* null, undefined, MinKey, MaxKey, EOD: no body */
		return 0;
	}
}

int sdb_keyenc_append_value(sdb_key *k, const bson_value_t *v, bool desc, char *err,
			    size_t errlen)
{
	static const bson_value_t null_value = {.value_type = BSON_TYPE_NULL};
	size_t start = k->len;
	int rc;

	if (!v || v->value_type == BSON_TYPE_EOD)
		v = &null_value;
	rc = put_value(k, v, 0, err, errlen);
	if (rc) {
		k->len = start;
		return rc;
	}
	if (desc) {
		for (size_t i = start; i < k->len; i++)
			k->data[i] ^= 0xff;
	}
	return 0;
}

int sdb_keyenc_append_value_coll(sdb_key *k, const bson_value_t *v, bool desc,
				 const sdb_collator *coll, char *err, size_t errlen)
{
	const sdb_collator *prev = enc_coll;
	int rc;

	enc_coll = coll;
	rc = sdb_keyenc_append_value(k, v, desc, err, errlen);
	enc_coll = prev;
	return rc;
}

const sdb_collator *sdb_keyenc_collation_swap(const sdb_collator *coll)
{
	const sdb_collator *prev = enc_coll;

	enc_coll = coll;
	return prev;
}

int sdb_keyenc_append_iter(sdb_key *k, const bson_iter_t *it, bool desc, char *err,
			   size_t errlen)
{
	bson_iter_t c;

	if (!it)
		return sdb_keyenc_append_value(k, NULL, desc, err, errlen);
	c = *it;
	return sdb_keyenc_append_value(k, bson_iter_value(&c), desc, err, errlen);
}

int sdb_key_cmp_raw(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? memcmp(a, b, n) : 0;

	if (c)
		return c < 0 ? -1 : 1;
	return (alen > blen) - (alen < blen);
}

int sdb_key_cmp(const sdb_key *a, const sdb_key *b)
{
	return sdb_key_cmp_raw(a->data, a->len, b->data, b->len);
}

bool sdb_key_prefix_successor(const uint8_t *prefix, size_t len, sdb_key *out)
{
	sdb_key_reset(out);
	while (len > 0 && prefix[len - 1] == 0xff)
		len--;
	if (len == 0)
		return false;
	sdb_key_append(out, prefix, len);
	out->data[len - 1]++;
	return true;
}

int64_t sdb_keyenc_hash_value(const bson_value_t *v)
{
	sdb_key k;
	bson_value_t null_v;
	char err[64];
	uint64_t h = 0;
	bool prev = legacy_numbers;

	sdb_key_init(&k);
	if (v == NULL) {
		memset(&null_v, 0, sizeof null_v);
		null_v.value_type = BSON_TYPE_NULL;
		v = &null_v;
	}
	legacy_numbers = true;
	if (sdb_keyenc_append_value(&k, v, false, err, sizeof err) == 0)
		h = (uint64_t)XXH64(k.data, k.len, 0);
	legacy_numbers = prev;
	sdb_key_free(&k);
	return (int64_t)h;
}

/* Does enc (an encoded value) hold a number bracket byte below its first byte? Without a
 * decoder that cannot tell a nested number from a string byte: true means "maybe". */
static bool nested_number_maybe(const uint8_t *enc, size_t len)
{
	return len > 1 && memchr(enc + 1, 0x1e, len - 1) != NULL;
}

bool sdb_keyenc_hash_encoded(const uint8_t *enc, size_t len, int64_t *out)
{
	uint8_t b[29];
	bson_value_t v = {.value_type = BSON_TYPE_DECIMAL128};
	uint64_t dhi = 0, dlo = 0, hi;
	int32_t dexp;

	if (len == 0)
		return false;
	switch (enc[0]) {
	case 0x1e: /* number */
		if (len != 29) {
			/* no inexact decimal: the exact and the frozen encodings are the same bytes
			 * (int, long, double and decimals with at most 64 significant bits) */
			break;
		}
		/* CLS EXP2 FRAC8 DEXP2 COEF15 of a decimal no 64-bit binary value equals: rebuild
		 * that decimal (coefficient * 10^(dexp - 33)) and hash it the frozen way */
		memcpy(b, enc, sizeof b);
		if (b[1] == 2)
			for (size_t i = 2; i < sizeof b; i++)
				b[i] ^= 0xff;
		dexp = (int32_t)(((uint32_t)b[12] << 8) | b[13]) - 32768;
		for (int i = 14; i < 21; i++)
			dhi = (dhi << 8) | b[i];
		for (int i = 21; i < 29; i++)
			dlo = (dlo << 8) | b[i];
		{
			/* the coefficient left-aligned to 34 digits: below the smallest exponent
			 * drop the trailing zeros the alignment added (an exact division) */
			__extension__ unsigned __int128 coef =
				((unsigned __int128)dhi << 64) | dlo;
			int32_t e = dexp - 33;

			for (; e < -6176; e++)
				coef /= 10;
			hi = (uint64_t)(e + 6176) << 49 |
			     ((uint64_t)(coef >> 64) & UINT64_C(0x1ffffffffffff));
			dlo = (uint64_t)coef;
		}
		if (b[1] == 2)
			hi |= UINT64_C(1) << 63;
		v.value.v_decimal128.high = hi;
		v.value.v_decimal128.low = dlo;
		*out = sdb_keyenc_hash_value(&v);
		return true;
	case 0x32: /* object, array, code with scope: a nested decimal may be encoded exactly */
	case 0x3c:
	case 0x96:
		if (nested_number_maybe(enc, len))
			return false;
		break;
	default:
		break;
	}
	*out = (int64_t)XXH64(enc, len, 0);
	return true;
}
