/* MongoDB wire protocol message codec. See msg.h for the byte layouts. */
#include "wire/msg.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"

/* ---- little-endian helpers ---- */

static uint32_t rd_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

static int32_t rd_i32(const uint8_t *p)
{
	uint32_t u = rd_u32(p);
	int32_t v;
	memcpy(&v, &u, sizeof v);
	return v;
}

static void wr_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void wr_i32(uint8_t *p, int32_t v)
{
	uint32_t u;
	memcpy(&u, &v, sizeof u);
	wr_u32(p, u);
}

/* ---- CRC-32C ---- */

static uint32_t crc32c_table[256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc32c_table[i] = c;
	}
}

uint32_t wire_crc32c(uint32_t crc, const void *data, size_t n)
{
	const uint8_t *p = data;
	pthread_once(&crc32c_once, crc32c_init);
	crc = ~crc;
	while (n--)
		crc = crc32c_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* ---- parsing ---- */

int32_t wire_msg_peek_length(const uint8_t *buf)
{
	return rd_i32(buf);
}

bool wire_msg_length_ok(int32_t len)
{
	return len >= WIRE_MSG_HEADER_LEN && len <= WIRE_MAX_MESSAGE_SIZE;
}

#define FAIL(rc_, code_, ...)                                                                   \
	do {                                                                                     \
		*code = (code_);                                                                 \
		return sdb_errf(err, errlen, (rc_), __VA_ARGS__);                                \
	} while (0)

/* Read one BSON document at p with `avail` bytes left in its container. On success *used
 * is its length and *doc a static view. */
static int read_doc(const uint8_t *p, size_t avail, const char *what, bson_t *doc, size_t *used,
		    int *code, char *err, size_t errlen)
{
	int32_t dlen;

	if (avail < 5)
		FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON, "%s: truncated document (%zu bytes left)",
		     what, avail);
	dlen = rd_i32(p);
	if (dlen < 5)
		FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON, "%s: invalid document length %d", what,
		     (int)dlen);
	if ((size_t)dlen > WIRE_MAX_BSON_SIZE)
		FAIL(SDB_ETOOBIG, WIRE_ERR_BSON_TOO_LARGE,
		     "%s: document of %d bytes is over maxBsonObjectSize %d", what, (int)dlen,
		     WIRE_MAX_BSON_SIZE);
	if ((size_t)dlen > avail)
		FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON,
		     "%s: document length %d exceeds the %zu bytes left", what, (int)dlen, avail);
	if (!bson_init_static(doc, p, (size_t)dlen))
		FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON, "%s: invalid document", what);
	/* one bounded walk (sdb_bson_well_formed: everything bson_validate(NONE) checks, and
	 * nesting, code-with-scope scopes included, bounded: libbson's walk recursed without a
	 * limit, so a document or a scope nested ~20,000 levels deep overflowed the loop
	 * thread's stack and killed the process) */
	if (!sdb_bson_well_formed(doc, 200))
		FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON,
		     "%s: invalid BSON (malformed, a field name not UTF-8, or an invalid nested "
		     "document or one nested deeper than 200 levels)",
		     what);
	*used = (size_t)dlen;
	return 0;
}

/* A NUL-terminated string inside p[0 .. avail). Returns its length or -1. */
static ssize_t read_cstring(const uint8_t *p, size_t avail)
{
	const uint8_t *nul = memchr(p, 0, avail);
	return nul ? (ssize_t)(nul - p) : -1;
}

static int parse_op_msg(const uint8_t *buf, size_t len, wire_msg *out, int *code, char *err,
			size_t errlen)
{
	size_t pos = WIRE_MSG_HEADER_LEN, end = len;
	bool have_body = false;
	uint32_t unknown;
	int rc;

	if (len < WIRE_MSG_HEADER_LEN + 4)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "OP_MSG: %zu bytes, too short for flagBits",
		     len);
	out->flags = rd_u32(buf + pos);
	pos += 4;
	unknown = out->flags & WIRE_MSG_FLAG_REQUIRED_MASK &
		  ~(WIRE_MSG_FLAG_CHECKSUM_PRESENT | WIRE_MSG_FLAG_MORE_TO_COME);
	if (unknown)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "OP_MSG: unknown required flag bits 0x%x", (unsigned)unknown);
	out->checksum_present = out->flags & WIRE_MSG_FLAG_CHECKSUM_PRESENT;
	out->more_to_come = out->flags & WIRE_MSG_FLAG_MORE_TO_COME;
	out->exhaust_allowed = out->flags & WIRE_MSG_FLAG_EXHAUST_ALLOWED;

	if (out->checksum_present) {
		uint32_t want, got;
		if (len < pos + 4)
			FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
			     "OP_MSG: checksumPresent but no room for the checksum");
		end = len - 4;
		want = rd_u32(buf + end);
		got = wire_crc32c(0, buf, end);
		if (want != got)
			FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
			     "OP_MSG: checksum mismatch (message says 0x%08x, computed 0x%08x)",
			     (unsigned)want, (unsigned)got);
	}

	while (pos < end) {
		uint8_t kind = buf[pos++];
		size_t used;

		if (kind == 0) {
			if (have_body)
				FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
				     "OP_MSG: more than one body section (kind 0)");
			rc = read_doc(buf + pos, end - pos, "OP_MSG body", &out->body, &used, code,
				      err, errlen);
			if (rc != 0)
				return rc;
			pos += used;
			have_body = true;
		} else if (kind == 1) {
			wire_msg_seq *seq;
			int32_t slen;
			ssize_t idlen;
			size_t spos, send;

			if (out->n_seqs == WIRE_MSG_MAX_SEQS)
				FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
				     "OP_MSG: more than %d document sequences", WIRE_MSG_MAX_SEQS);
			if (end - pos < 4)
				FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
				     "OP_MSG: truncated document sequence size");
			slen = rd_i32(buf + pos);
			if (slen < 5 || (size_t)slen > end - pos)
				FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
				     "OP_MSG: document sequence size %d does not fit the %zu bytes left",
				     (int)slen, end - pos);
			spos = pos + 4;
			send = pos + (size_t)slen;
			idlen = read_cstring(buf + spos, send - spos);
			if (idlen < 0)
				FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
				     "OP_MSG: unterminated document sequence identifier");
			/* it becomes a field name of the command document */
			if (!bson_utf8_validate((const char *)(buf + spos), (size_t)idlen, false))
				FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
				     "OP_MSG: document sequence identifier is not valid UTF-8");
			seq = &out->seqs[out->n_seqs];
			seq->identifier = (const char *)(buf + spos);
			spos += (size_t)idlen + 1;
			seq->docs = buf + spos;
			seq->docs_len = send - spos;
			seq->n_docs = 0;
			while (spos < send) {
				bson_t doc;
				rc = read_doc(buf + spos, send - spos, "OP_MSG document sequence", &doc,
					      &used, code, err, errlen);
				if (rc != 0)
					return rc;
				spos += used;
				seq->n_docs++;
			}
			out->n_seqs++;
			pos = send;
		} else {
			FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "OP_MSG: unknown section kind %u",
			     (unsigned)kind);
		}
	}
	if (!have_body)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "OP_MSG: no body section (kind 0)");
	return 0;
}

static int parse_op_query(const uint8_t *buf, size_t len, wire_msg *out, int *code, char *err,
			  size_t errlen)
{
	size_t pos = WIRE_MSG_HEADER_LEN, used;
	ssize_t nslen;
	int rc;

	if (len < pos + 4)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "OP_QUERY: truncated flags");
	out->query_flags = rd_i32(buf + pos);
	pos += 4;
	nslen = read_cstring(buf + pos, len - pos);
	if (nslen < 0)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "OP_QUERY: unterminated fullCollectionName");
	if (!bson_utf8_validate((const char *)(buf + pos), (size_t)nslen, false))
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "OP_QUERY: fullCollectionName is not valid UTF-8");
	out->full_collection_name = (const char *)(buf + pos);
	pos += (size_t)nslen + 1;
	if (len - pos < 8)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "OP_QUERY: truncated numberToSkip/numberToReturn");
	out->number_to_skip = rd_i32(buf + pos);
	out->number_to_return = rd_i32(buf + pos + 4);
	pos += 8;
	rc = read_doc(buf + pos, len - pos, "OP_QUERY query", &out->body, &used, code, err, errlen);
	if (rc != 0)
		return rc;
	pos += used;
	if (pos < len) {
		rc = read_doc(buf + pos, len - pos, "OP_QUERY returnFieldsSelector", &out->fields,
			      &used, code, err, errlen);
		if (rc != 0)
			return rc;
		pos += used;
		out->has_fields = true;
	}
	if (pos != len)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "OP_QUERY: %zu trailing bytes", len - pos);
	return 0;
}

static int parse_op_get_more(const uint8_t *buf, size_t len, wire_msg *out, int *code,
			     char *err, size_t errlen)
{
	size_t pos = WIRE_MSG_HEADER_LEN;
	ssize_t nslen;
	uint64_t id;

	if (len < pos + 4)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "OP_GET_MORE: truncated ZERO field");
	pos += 4;
	nslen = read_cstring(buf + pos, len - pos);
	if (nslen < 0)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "OP_GET_MORE: unterminated fullCollectionName");
	if (!bson_utf8_validate((const char *)(buf + pos), (size_t)nslen, false))
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "OP_GET_MORE: fullCollectionName is not valid UTF-8");
	out->full_collection_name = (const char *)(buf + pos);
	pos += (size_t)nslen + 1;
	if (len - pos != 12)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "OP_GET_MORE: %zu bytes after fullCollectionName, want 12 (numberToReturn, "
		     "cursorID)",
		     len - pos);
	out->number_to_return = rd_i32(buf + pos);
	id = (uint64_t)rd_u32(buf + pos + 4) | ((uint64_t)rd_u32(buf + pos + 8) << 32);
	memcpy(&out->cursor_id, &id, sizeof id);
	return 0;
}

static int parse_op_compressed(const uint8_t *buf, size_t len, wire_msg *out, int *code,
			       char *err, size_t errlen)
{
	if (len < WIRE_MSG_HEADER_LEN + 9)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "OP_COMPRESSED: truncated header");
	out->original_op_code = rd_i32(buf + 16);
	out->uncompressed_size = rd_i32(buf + 20);
	out->compressor_id = buf[24];
	return 0;
}

int wire_msg_parse(const uint8_t *buf, size_t len, wire_msg *out, int *code, char *err,
		   size_t errlen)
{
	memset(out, 0, sizeof *out);
	*code = 0;
	if (len < WIRE_MSG_HEADER_LEN)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "message of %zu bytes is shorter than the 16-byte header", len);
	out->hdr.message_length = rd_i32(buf);
	out->hdr.request_id = rd_i32(buf + 4);
	out->hdr.response_to = rd_i32(buf + 8);
	out->hdr.op_code = rd_i32(buf + 12);
	if (out->hdr.message_length > WIRE_MAX_MESSAGE_SIZE)
		FAIL(SDB_ETOOBIG, WIRE_ERR_BSON_TOO_LARGE,
		     "messageLength %d is over maxMessageSizeBytes %d",
		     (int)out->hdr.message_length, WIRE_MAX_MESSAGE_SIZE);
	if (out->hdr.message_length < WIRE_MSG_HEADER_LEN ||
	    (size_t)out->hdr.message_length != len)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR,
		     "messageLength %d does not match the %zu bytes of the message",
		     (int)out->hdr.message_length, len);
	switch (out->hdr.op_code) {
	case WIRE_OP_MSG:
		return parse_op_msg(buf, len, out, code, err, errlen);
	case WIRE_OP_QUERY:
		return parse_op_query(buf, len, out, code, err, errlen);
	case WIRE_OP_GET_MORE:
		return parse_op_get_more(buf, len, out, code, err, errlen);
	case WIRE_OP_COMPRESSED:
		return parse_op_compressed(buf, len, out, code, err, errlen);
	default:
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "unsupported opCode %d",
		     (int)out->hdr.op_code);
	}
}

/* ---- building the command document ---- */

int wire_msg_command(const wire_msg *msg, bson_t *out, int *code, char *err, size_t errlen)
{
	bson_iter_t it;

	*code = 0;
	if (msg->hdr.op_code == WIRE_OP_QUERY) {
		if (bson_iter_init(&it, &msg->body) && bson_iter_next(&it) &&
		    strcmp(bson_iter_key(&it), "$query") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			const uint8_t *data;
			uint32_t dlen;
			bson_t inner;
			bson_iter_document(&it, &dlen, &data);
			if (!bson_init_static(&inner, data, dlen))
				FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON, "OP_QUERY: invalid $query");
			bson_concat(out, &inner);
		} else {
			bson_concat(out, &msg->body);
		}
		return 0;
	}
	if (msg->hdr.op_code != WIRE_OP_MSG)
		FAIL(SDB_EPROTO, WIRE_ERR_PROTOCOL_ERROR, "opCode %d carries no command",
		     (int)msg->hdr.op_code);

	/* as mongod's OpMsg::parse (op_msg.cpp): two sequences of one name are refused as
	 * the sections are read (40431), then a sequence named as a body field (40433) */
	for (size_t i = 0; i < msg->n_seqs; i++) {
		if (msg->seqs[i].identifier[0] == '\0')
			FAIL(SDB_EPROTO, WIRE_ERR_BAD_VALUE,
			     "OP_MSG: document sequence with an empty identifier");
		for (size_t j = 0; j < i; j++)
			if (strcmp(msg->seqs[j].identifier, msg->seqs[i].identifier) == 0)
				FAIL(SDB_EPROTO, WIRE_ERR_DUPLICATE_DOC_SEQUENCE,
				     "Duplicate document sequence: %s", msg->seqs[i].identifier);
	}
	for (size_t i = 0; i < msg->n_seqs; i++)
		if (bson_iter_init_find(&it, &msg->body, msg->seqs[i].identifier))
			FAIL(SDB_EPROTO, WIRE_ERR_DUPLICATE_BODY_SEQUENCE,
			     "Duplicate field between body and document sequence %s",
			     msg->seqs[i].identifier);
	bson_concat(out, &msg->body);
	for (size_t i = 0; i < msg->n_seqs; i++) {
		const wire_msg_seq *seq = &msg->seqs[i];
		bson_t arr, doc;
		size_t pos = 0;
		uint32_t idx = 0;

		bson_append_array_begin(out, seq->identifier, -1, &arr);
		while (pos < seq->docs_len) {
			char keybuf[16];
			const char *key;
			uint32_t dlen = rd_u32(seq->docs + pos);
			/* already validated by wire_msg_parse */
			if (!bson_init_static(&doc, seq->docs + pos, dlen)) {
				bson_append_array_end(out, &arr);
				FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON,
				     "OP_MSG: invalid document in sequence '%s'", seq->identifier);
			}
			bson_uint32_to_string(idx++, &key, keybuf, sizeof keybuf);
			bson_append_document(&arr, key, -1, &doc);
			pos += dlen;
		}
		bson_append_array_end(out, &arr);
	}
	return 0;
}

/* ---- legacy OP_QUERY on a collection ---- */

/* One $-modifier of a wrapped legacy query (mongod's QueryRequest::initFullQuery) and the
 * find field it becomes; type: 'd' document, 'h' document or string, 'n' number,
 * 'b' any (truthiness), '*' any. */
static const struct {
	const char *modifier;
	const char *field;
	char type;
} legacy_modifiers[] = {
	{"$orderby", "sort", 'd'},   {"orderby", "sort", 'd'},
	{"$hint", "hint", 'h'},	     {"$comment", "comment", '*'},
	{"$maxTimeMS", "maxTimeMS", 'n'}, {"$min", "min", 'd'},
	{"$max", "max", 'd'},	     {"$returnKey", "returnKey", 'b'},
	{"$showDiskLoc", "showRecordId", 'b'}, {"$readPreference", "$readPreference", 'd'},
};

static bool legacy_type_ok(const bson_iter_t *it, char type)
{
	switch (type) {
	case 'd':
		return BSON_ITER_HOLDS_DOCUMENT(it);
	case 'h':
		return BSON_ITER_HOLDS_DOCUMENT(it) || BSON_ITER_HOLDS_UTF8(it);
	case 'n':
		return BSON_ITER_HOLDS_NUMBER(it);
	default:
		return true;
	}
}

/* The row of legacy_modifiers for modifier k, or -1. */
static int legacy_modifier_find(const char *k)
{
	int n = (int)(sizeof legacy_modifiers / sizeof legacy_modifiers[0]);

	for (int i = 0; i < n; i++)
		if (strcmp(k, legacy_modifiers[i].modifier) == 0)
			return i;
	return -1;
}

/* Append the find fields of the modifiers of a wrapped query (every field of q but the
 * wrapper `wrapper`). */
static int legacy_modifiers_append(const bson_t *q, const char *wrapper, bson_t *out,
				   int *code, char *err, size_t errlen)
{
	bson_iter_t it;

	if (!bson_iter_init(&it, q))
		FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON, "OP_QUERY: invalid query document");
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		int i;

		if (strcmp(k, wrapper) == 0)
			continue;
		i = legacy_modifier_find(k);
		if (i < 0)
			FAIL(SDB_EINVAL, WIRE_ERR_BAD_VALUE,
			     "OP_QUERY: query modifier '%.100s' is not supported (supported: "
			     "$orderby, $hint, $comment, $maxTimeMS, $min, $max, $returnKey, "
			     "$showDiskLoc, $readPreference; use the find or explain command)",
			     k);
		if (!legacy_type_ok(&it, legacy_modifiers[i].type))
			FAIL(SDB_EINVAL, WIRE_ERR_BAD_VALUE,
			     "OP_QUERY: query modifier '%.100s' has the wrong type", k);
		if (legacy_modifiers[i].type == 'b')
			BSON_APPEND_BOOL(out, legacy_modifiers[i].field, bson_iter_as_bool(&it));
		else
			bson_append_iter(out, legacy_modifiers[i].field, -1, &it);
	}
	return 0;
}

int wire_msg_legacy_get_more_cmd(const wire_msg *msg, bson_t *out, char **db, char **coll,
				 int *code, char *err, size_t errlen)
{
	const char *ns = msg->full_collection_name;
	const char *dot = ns ? strchr(ns, '.') : NULL;
	int32_t n = msg->number_to_return;

	*code = 0;
	*db = *coll = NULL;
	if (!dot || dot == ns || dot[1] == '\0')
		FAIL(SDB_EINVAL, WIRE_ERR_INVALID_NAMESPACE,
		     "OP_GET_MORE: invalid namespace '%.100s' (want <db>.<collection>)",
		     ns ? ns : "");
	*db = sdb_strndup(ns, (size_t)(dot - ns));
	*coll = sdb_strdup(dot + 1);
	wire_msg_legacy_get_more(msg->cursor_id, *db, *coll,
				 n == INT32_MIN ? INT32_MAX : n < 0 ? -n : n, out);
	return 0;
}

int wire_msg_legacy_find(const wire_msg *msg, bson_t *out, char **db, char **coll,
			 int32_t *batch, int *code, char *err, size_t errlen)
{
	const char *ns = msg->full_collection_name;
	const char *dot = ns ? strchr(ns, '.') : NULL;
	const char *wrapper = NULL;
	int32_t flags = msg->query_flags, ntoreturn = msg->number_to_return;
	bson_t filter;
	bson_iter_t it;

	*code = 0;
	*db = *coll = NULL;
	*batch = 0;
	if (!dot || dot == ns || dot[1] == '\0')
		FAIL(SDB_EINVAL, WIRE_ERR_INVALID_NAMESPACE,
		     "OP_QUERY: invalid namespace '%.100s' (want <db>.<collection> or <db>.$cmd)",
		     ns ? ns : "");
	if ((flags & WIRE_QUERY_FLAG_EXHAUST) && (flags & WIRE_QUERY_FLAG_TAILABLE) &&
	    !(flags & WIRE_QUERY_FLAG_AWAIT_DATA))
		FAIL(SDB_EINVAL, WIRE_ERR_BAD_VALUE,
		     "OP_QUERY: an exhaust cursor that is tailable must also be awaitData (its "
		     "stream of empty batches would never pause)");
	if (msg->number_to_skip < 0)
		FAIL(SDB_EINVAL, WIRE_ERR_BAD_VALUE, "OP_QUERY: negative numberToSkip %d",
		     (int)msg->number_to_skip);
	/* mongod: `query`, else `$query`, when it is a document, wraps the filter */
	if (bson_iter_init_find(&it, &msg->body, "query") && BSON_ITER_HOLDS_DOCUMENT(&it))
		wrapper = "query";
	else if (bson_iter_init_find(&it, &msg->body, "$query") && BSON_ITER_HOLDS_DOCUMENT(&it))
		wrapper = "$query";
	if (wrapper) {
		const uint8_t *data;
		uint32_t dlen;
		bson_iter_document(&it, &dlen, &data);
		if (!bson_init_static(&filter, data, dlen))
			FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON, "OP_QUERY: invalid %s", wrapper);
	} else if (!bson_init_static(&filter, bson_get_data(&msg->body),
				     wire_bson_len(&msg->body))) {
		FAIL(SDB_EPROTO, WIRE_ERR_INVALID_BSON, "OP_QUERY: invalid query document");
	}

	bson_append_utf8(out, "find", -1, dot + 1, -1);
	BSON_APPEND_DOCUMENT(out, "filter", &filter);
	if (msg->has_fields && !bson_empty(&msg->fields))
		BSON_APPEND_DOCUMENT(out, "projection", &msg->fields);
	if (msg->number_to_skip > 0)
		BSON_APPEND_INT32(out, "skip", msg->number_to_skip);
	if (ntoreturn < 0 || ntoreturn == 1) {
		/* -INT32_MIN does not fit: as mongod, the largest limit */
		BSON_APPEND_INT64(out, "limit", ntoreturn == INT32_MIN ? INT32_MAX
						 : ntoreturn < 0 ? -(int64_t)ntoreturn
								 : 1);
		BSON_APPEND_BOOL(out, "singleBatch", true);
	} else if (ntoreturn > 1) {
		BSON_APPEND_INT32(out, "batchSize", ntoreturn);
		*batch = ntoreturn;
	}
	if (wrapper) {
		int rc = legacy_modifiers_append(&msg->body, wrapper, out, code, err, errlen);
		if (rc != 0)
			return rc;
	}
	if (flags & WIRE_QUERY_FLAG_TAILABLE) {
		BSON_APPEND_BOOL(out, "tailable", true);
		if (flags & WIRE_QUERY_FLAG_AWAIT_DATA)
			BSON_APPEND_BOOL(out, "awaitData", true);
	}
	if (flags & WIRE_QUERY_FLAG_NO_CURSOR_TIMEOUT)
		BSON_APPEND_BOOL(out, "noCursorTimeout", true);
	if (flags & WIRE_QUERY_FLAG_PARTIAL)
		BSON_APPEND_BOOL(out, "allowPartialResults", true);
	if ((flags & WIRE_QUERY_FLAG_SLAVE_OK) && !bson_iter_init_find(&it, out, "$readPreference")) {
		bson_t rp;
		bson_append_document_begin(out, "$readPreference", -1, &rp);
		BSON_APPEND_UTF8(&rp, "mode", "secondaryPreferred");
		bson_append_document_end(out, &rp);
	}
	bson_append_utf8(out, "$db", -1, ns, (int)(dot - ns));
	*db = sdb_strndup(ns, (size_t)(dot - ns));
	*coll = sdb_strdup(dot + 1);
	return 0;
}

void wire_msg_legacy_get_more(int64_t cursor_id, const char *db, const char *coll,
			      int32_t batch, bson_t *out)
{
	BSON_APPEND_INT64(out, "getMore", cursor_id);
	BSON_APPEND_UTF8(out, "collection", coll);
	if (batch > 0)
		BSON_APPEND_INT32(out, "batchSize", batch);
	BSON_APPEND_UTF8(out, "$db", db);
}

/* ---- encoding ---- */

uint32_t wire_bson_len(const bson_t *b)
{
	return rd_u32(bson_get_data(b));
}

static void put_header(uint8_t *p, size_t len, int32_t request_id, int32_t response_to,
		       int32_t op_code)
{
	wr_i32(p, (int32_t)len);
	wr_i32(p + 4, request_id);
	wr_i32(p + 8, response_to);
	wr_i32(p + 12, op_code);
}

void wire_msg_encode_msg_prefix(uint8_t out[WIRE_MSG_PREFIX_LEN], int32_t request_id,
				int32_t response_to, uint32_t flags, uint32_t body_len)
{
	put_header(out, WIRE_MSG_PREFIX_LEN + (size_t)body_len, request_id, response_to,
		   WIRE_OP_MSG);
	wr_u32(out + 16, flags & ~WIRE_MSG_FLAG_CHECKSUM_PRESENT);
	out[20] = 0;
}

int wire_msg_check_doc(const uint8_t *p, size_t len, char *err, size_t errlen)
{
	bson_t doc;
	size_t used = 0;
	int code = 0;
	int rc = read_doc(p, len, "body", &doc, &used, &code, err, errlen);

	if (rc == 0 && used != len)
		rc = sdb_errf(err, errlen, SDB_EPROTO, "body: a document of %zu bytes in %zu",
			      used, len);
	return rc;
}

bool wire_msg_prefix_is_plain(const uint8_t *prefix, int32_t response_to)
{
	return rd_i32(prefix + 8) == response_to && rd_i32(prefix + 12) == WIRE_OP_MSG &&
	       rd_u32(prefix + 16) == 0 && prefix[20] == 0;
}

uint8_t *wire_msg_encode_msg(int32_t request_id, int32_t response_to, uint32_t flags,
			     const bson_t *body, size_t *len)
{
	size_t n = WIRE_MSG_PREFIX_LEN + wire_bson_len(body);
	uint8_t *p = sdb_malloc(n);

	wire_msg_encode_msg_prefix(p, request_id, response_to, flags, wire_bson_len(body));
	memcpy(p + WIRE_MSG_PREFIX_LEN, bson_get_data(body), wire_bson_len(body));
	*len = n;
	return p;
}

static bool doc_is_ok(const bson_t *doc)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, doc, "ok") && bson_iter_as_bool(&it);
}

/* The legacy error document of a failed reply: {$err: errmsg, <doc's fields>, [code: 8],
 * [ok: 0]} (mongod: {$err, code, ok: 0}). Heap, bson_destroy(). */
static bson_t *legacy_error_doc(const bson_t *doc)
{
	bson_t *out = bson_new();
	bson_iter_t it;

	if (bson_iter_init_find(&it, doc, "$err") && BSON_ITER_HOLDS_UTF8(&it)) {
		bson_concat(out, doc);
	} else {
		const char *msg = "unknown error";
		if (bson_iter_init_find(&it, doc, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
			msg = bson_iter_utf8(&it, NULL);
		BSON_APPEND_UTF8(out, "$err", msg);
		bson_copy_to_excluding_noinit(doc, out, "$err", NULL);
	}
	if (!bson_iter_init_find(&it, out, "code"))
		BSON_APPEND_INT32(out, "code", 8); /* UnknownError */
	if (!bson_iter_init_find(&it, out, "ok"))
		BSON_APPEND_DOUBLE(out, "ok", 0.0);
	return out;
}

/* An OP_REPLY header + body of `body_len` bytes (copied by the caller to p + 36). */
static uint8_t *reply_begin(int32_t request_id, int32_t response_to, int32_t response_flags,
			    int64_t cursor_id, int32_t starting_from, int32_t n_returned,
			    size_t body_len, size_t *len)
{
	size_t n = WIRE_MSG_HEADER_LEN + 20 + body_len;
	uint8_t *p = sdb_malloc(n);
	uint64_t cid;

	memcpy(&cid, &cursor_id, sizeof cid);
	put_header(p, n, request_id, response_to, WIRE_OP_REPLY);
	wr_i32(p + 16, response_flags);
	wr_u32(p + 20, (uint32_t)cid);
	wr_u32(p + 24, (uint32_t)(cid >> 32));
	wr_i32(p + 28, starting_from);
	wr_i32(p + 32, n_returned);
	*len = n;
	return p;
}

uint8_t *wire_msg_encode_reply(int32_t request_id, int32_t response_to, int32_t response_flags,
			       const bson_t *doc, size_t *len)
{
	bson_t *err = NULL;
	uint8_t *p;

	if ((response_flags & WIRE_REPLY_FLAG_QUERY_FAILURE) || !doc_is_ok(doc))
		doc = err = legacy_error_doc(doc);
	p = reply_begin(request_id, response_to, response_flags, 0, 0, 1, wire_bson_len(doc), len);
	memcpy(p + 36, bson_get_data(doc), wire_bson_len(doc));
	if (err)
		bson_destroy(err);
	return p;
}

uint8_t *wire_msg_encode_cursor_reply(int32_t request_id, int32_t response_to,
				      int32_t response_flags, int32_t starting_from,
				      const bson_t *reply, int64_t *cursor_id,
				      int32_t *n_returned, size_t *len)
{
	bson_iter_t it, cur, batch;
	bool have_id = false, have_batch = false;
	int64_t id = 0;
	size_t body = 0;
	int32_t n = 0;
	uint8_t *p;

	*cursor_id = 0;
	*n_returned = 1;
	if (doc_is_ok(reply) && bson_iter_init_find(&it, reply, "cursor") &&
	    BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &cur)) {
		while (bson_iter_next(&cur)) {
			const char *k = bson_iter_key(&cur);
			if (strcmp(k, "id") == 0 && BSON_ITER_HOLDS_INT(&cur)) {
				id = bson_iter_as_int64(&cur);
				have_id = true;
			} else if ((strcmp(k, "firstBatch") == 0 || strcmp(k, "nextBatch") == 0) &&
				   BSON_ITER_HOLDS_ARRAY(&cur)) {
				batch = cur;
				have_batch = true;
			}
		}
	}
	if (!have_id || !have_batch) {
		bson_t *bad = NULL;
		if (bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it) &&
		    bson_iter_as_int64(&it) == WIRE_ERR_CURSOR_NOT_FOUND) {
			*n_returned = 0;
			return reply_begin(request_id, response_to,
					   response_flags | WIRE_REPLY_FLAG_CURSOR_NOT_FOUND, 0, 0, 0,
					   0, len);
		}
		if (doc_is_ok(reply)) /* a handler bug: never sent as a success */
			reply = bad = BCON_NEW("ok", BCON_DOUBLE(0.0), "errmsg",
					       BCON_UTF8("internal error: find or getMore reply "
							 "without a cursor"),
					       "code", BCON_INT32(WIRE_ERR_INTERNAL));
		p = wire_msg_encode_reply(request_id, response_to,
					  response_flags | WIRE_REPLY_FLAG_QUERY_FAILURE, reply, len);
		if (bad)
			bson_destroy(bad);
		return p;
	}
	/* the documents, laid end to end: first their size, then copy */
	it = batch;
	if (bson_iter_recurse(&it, &cur))
		while (bson_iter_next(&cur))
			if (BSON_ITER_HOLDS_DOCUMENT(&cur)) {
				const uint8_t *d;
				uint32_t dl;
				bson_iter_document(&cur, &dl, &d);
				body += dl;
				n++;
			}
	p = reply_begin(request_id, response_to, response_flags, id, starting_from, n, body, len);
	it = batch;
	if (bson_iter_recurse(&it, &cur)) {
		size_t off = 36;
		while (bson_iter_next(&cur))
			if (BSON_ITER_HOLDS_DOCUMENT(&cur)) {
				const uint8_t *d;
				uint32_t dl;
				bson_iter_document(&cur, &dl, &d);
				memcpy(p + off, d, dl);
				off += dl;
			}
	}
	*cursor_id = id;
	*n_returned = n;
	return p;
}
