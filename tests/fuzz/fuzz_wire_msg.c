/* libFuzzer target for the wire protocol codec (src/wire/msg.c).
 *
 * Input: bytes as they would arrive on a connection. The target frames them as the server
 * does (messageLength first, refused outside 16 .. maxMessageSizeBytes), parses each
 * complete message, builds the command document a handler would see, walks it, and
 * re-encodes the reply formats. Any crash, sanitizer report or broken invariant (checked
 * with abort) is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "wire/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_command(const wire_msg *msg)
{
	bson_t cmd;
	bson_iter_t it;
	char err[256];
	int code = 0;
	size_t n = 0;

	bson_init(&cmd);
	if (wire_msg_command(msg, &cmd, &code, err, sizeof err) == 0) {
		/* the command document must be walkable end to end */
		if (!bson_iter_init(&it, &cmd))
			abort();
		while (bson_iter_next(&it))
			n++;
		if (!bson_validate(&cmd, BSON_VALIDATE_NONE, NULL))
			abort();
		{
			size_t len;
			uint8_t *m = wire_msg_encode_msg(1, msg->hdr.request_id, 0, &cmd, &len);
			wire_msg back;
			if (wire_msg_parse(m, len, &back, &code, err, sizeof err) != 0 &&
			    code != WIRE_ERR_BSON_TOO_LARGE)
				abort();
			free(m);
			m = wire_msg_encode_reply(1, msg->hdr.request_id, 0, &cmd, &len);
			free(m);
		}
	} else if (code == 0) {
		abort(); /* every failure names a MongoDB error code */
	}
	(void)n;
	bson_destroy(&cmd);
}

/* A legacy query on a collection or an OP_GET_MORE: the find/getMore command it runs, and
 * that command document fed to the OP_REPLY cursor encoder (any shape must encode). */
static void check_legacy(const wire_msg *msg)
{
	bson_t cmd;
	char err[256];
	char *db = NULL, *coll = NULL;
	int code = 0, rc;
	int32_t batch = 0, n = -1;
	int64_t id = -1;
	size_t len;
	uint8_t *m;

	bson_init(&cmd);
	if (msg->hdr.op_code == WIRE_OP_GET_MORE)
		rc = wire_msg_legacy_get_more_cmd(msg, &cmd, &db, &coll, &code, err, sizeof err);
	else
		rc = wire_msg_legacy_find(msg, &cmd, &db, &coll, &batch, &code, err, sizeof err);
	if (rc == 0) {
		if (!db || !coll || !bson_validate(&cmd, BSON_VALIDATE_NONE, NULL))
			abort();
	} else if (code == 0 || db || coll) {
		abort();
	}
	m = wire_msg_encode_cursor_reply(1, msg->hdr.request_id, 0, 0, &cmd, &id, &n, &len);
	if (len < 36 || wire_msg_peek_length(m) != (int32_t)len || n < 0)
		abort();
	free(m);
	free(db);
	free(coll);
	bson_destroy(&cmd);
}

static void check_message(const wire_msg *msg)
{
	if (msg->hdr.op_code == WIRE_OP_GET_MORE ||
	    (msg->hdr.op_code == WIRE_OP_QUERY && !strstr(msg->full_collection_name, ".$cmd")))
		check_legacy(msg);
	if (msg->hdr.op_code == WIRE_OP_MSG || msg->hdr.op_code == WIRE_OP_QUERY)
		check_command(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;

	/* the whole input as one message, whatever its length field says */
	{
		wire_msg msg;
		char err[256];
		int code = 0;
		uint8_t *copy = malloc(size ? size : 1);
		if (size > 0)
			memcpy(copy, data, size);
		if (wire_msg_parse(copy, size, &msg, &code, err, sizeof err) == 0) {
			check_message(&msg);
		} else if (code == 0 || err[0] == '\0') {
			abort();
		}
		free(copy);
	}

	/* framed as a stream of messages */
	while (size - off >= 4) {
		int32_t mlen = wire_msg_peek_length(data + off);
		wire_msg msg;
		char err[256];
		int code = 0;
		uint8_t *copy;

		if (!wire_msg_length_ok(mlen) || (size_t)mlen > size - off)
			break;
		/* exact-size heap copy so ASan catches any read past the message */
		copy = malloc((size_t)mlen);
		memcpy(copy, data + off, (size_t)mlen);
		if (wire_msg_parse(copy, (size_t)mlen, &msg, &code, err, sizeof err) == 0)
			check_message(&msg);
		free(copy);
		off += (size_t)mlen;
	}
	return 0;
}
