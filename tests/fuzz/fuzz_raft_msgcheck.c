/* libFuzzer target for the validator of libraft's message stream (raft/msgcheck.c): what
 * any TCP client may send to a Raft port after libraft's preamble.
 *
 * Input: byte 0 gives the chunk size of the second feed (1..256); the rest is the stream.
 * It is fed twice: whole, and in chunks. Invariants (abort): the bytes let through are
 * exactly a prefix of the input (never altered, never reordered); both feeds let the same
 * bytes through and fail or not alike; every message header let through passes
 * sdb_rmsg_check_header again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "raft/msgcheck.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct out {
	uint8_t *buf;
	size_t len, cap;
} out;

static int emit(void *arg, const uint8_t *p, size_t n)
{
	out *o = arg;
	if (o->len + n > o->cap) {
		o->cap = (o->len + n) * 2;
		o->buf = realloc(o->buf, o->cap);
		if (!o->buf)
			abort();
	}
	memcpy(o->buf + o->len, p, n);
	o->len += n;
	return 0;
}

static int run(const uint8_t *in, size_t len, size_t chunk, out *o)
{
	sdb_rmsg m;
	int rc = 0;
	sdb_rmsg_init(&m);
	for (size_t i = 0; i < len && rc == 0; i += chunk)
		rc = sdb_rmsg_feed(&m, in + i, len - i < chunk ? len - i : chunk, emit, o);
	sdb_rmsg_free(&m);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	out a = {0}, b = {0};
	size_t chunk;
	int ra, rb;
	if (size < 1)
		return 0;
	chunk = (size_t)data[0] + 1;
	ra = run(data + 1, size - 1, size, &a);
	rb = run(data + 1, size - 1, chunk, &b);
	if (ra != rb || a.len != b.len || a.len > size - 1 ||
	    (a.len && (memcmp(a.buf, data + 1, a.len) != 0 || memcmp(b.buf, a.buf, a.len) != 0)))
		abort();
	/* each header let through checks again; payloads are skipped by their length */
	for (size_t o = 0; o + 16 <= a.len;) {
		uint64_t type = 0, hlen = 0, payload;
		const char *why;
		for (int i = 7; i >= 0; i--) {
			type = (type << 8) | a.buf[o + i];
			hlen = (hlen << 8) | a.buf[o + 8 + i];
		}
		if (o + 16 + hlen > a.len)
			abort(); /* a header is let through whole or not at all */
		if (sdb_rmsg_check_header(type, a.buf + o + 16, (size_t)hlen, &payload, &why) != 0)
			abort();
		o += 16 + hlen;
		if (payload > a.len - o)
			break; /* payload still streaming */
		o += payload;
	}
	free(a.buf);
	free(b.buf);
	return 0;
}
