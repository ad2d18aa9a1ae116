/* The validator of libraft 0.15's message stream. Contract and layouts in raft/msgcheck.h. */
#include "raft/msgcheck.h"

#include <stdlib.h>
#include <string.h>

enum { ST_PRE, ST_HDR, ST_PAYLOAD, ST_FAILED };

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int bad(const char **why, const char *text)
{
	*why = text;
	return -1;
}

/* libraft's configurationDecode input: format 1, n >= 1 servers, each an id, a
 * NUL-terminated address and a role (0 standby, 1 voter, 2 spare), all within len. */
static int check_conf(const uint8_t *p, size_t len, const char **why)
{
	size_t o = 9;
	uint64_t n;
	if (len < 9 || p[0] != 1)
		return bad(why, "snapshot configuration: bad format");
	n = get64(p + 1);
	if (n == 0 || n > len / 10) /* each server takes at least 8 + 1 + 1 bytes */
		return bad(why, "snapshot configuration: bad server count");
	for (uint64_t i = 0; i < n; i++) {
		const uint8_t *nul;
		if (len - o < 8 + 1 + 1)
			return bad(why, "snapshot configuration: truncated");
		o += 8;
		nul = memchr(p + o, '\0', len - o);
		if (!nul || nul == p + o)
			return bad(why, "snapshot configuration: bad address");
		o = (size_t)(nul - p) + 1;
		if (o >= len || p[o] > 2)
			return bad(why, "snapshot configuration: bad role");
		o++;
	}
	return 0;
}

int sdb_rmsg_check_header(uint64_t type, const uint8_t *hdr, size_t len, uint64_t *payload,
			  const char **why)
{
	*payload = 0;
	if (len == 0 || len > SDB_RMSG_HEADER_MAX)
		return bad(why, "message header length out of range");
	switch (type) {
	case 3: /* RequestVote */
		if (len != 32 && len < 40)
			return bad(why, "RequestVote header too short");
		return 0;
	case 4: /* RequestVoteResult */
		if (len != 16 && len < 24)
			return bad(why, "RequestVoteResult header too short");
		return 0;
	case 2: /* AppendEntriesResult */
	case 6: /* TimeoutNow */
		if (len < 24)
			return bad(why, "message header too short");
		return 0;
	case 1: { /* AppendEntries */
		uint64_t n, total = 0, pos = 0;
		if (len < 40)
			return bad(why, "AppendEntries header too short");
		n = get64(hdr + 32);
		if (n > (len - 40) / 16)
			return bad(why, "AppendEntries entry count beyond its header");
		/* libraft's uvDecodeEntriesBatch: entry i starts where i-1 ended, padded to 8 */
		for (uint64_t i = 0; i < n; i++) {
			const uint8_t *e = hdr + 40 + 16 * i;
			uint32_t elen = get32(e + 12);
			if (e[8] < 1 || e[8] > 3)
				return bad(why, "AppendEntries entry of unknown type");
			if (elen == 0)
				return bad(why, "AppendEntries empty entry");
			total += elen;
		}
		for (uint64_t i = 0; i < n; i++) {
			uint32_t elen = get32(hdr + 40 + 16 * i + 12);
			if (pos + elen > total)
				return bad(why, "AppendEntries entries overrun the payload");
			pos += elen;
			if (elen % 8)
				pos += 8 - elen % 8;
		}
		*payload = total;
		return 0;
	}
	case 5: { /* InstallSnapshot */
		uint64_t conf_len, data_len;
		if (len < 48)
			return bad(why, "InstallSnapshot header too short");
		conf_len = get64(hdr + 32);
		if (conf_len > len - 48)
			return bad(why, "InstallSnapshot configuration beyond its header");
		if (check_conf(hdr + 40, (size_t)conf_len, why) != 0)
			return -1;
		data_len = get64(hdr + 40 + conf_len);
		if (data_len == 0)
			return bad(why, "InstallSnapshot without data");
		*payload = data_len;
		return 0;
	}
	default:
		return bad(why, "unknown Raft message type");
	}
}

void sdb_rmsg_init(sdb_rmsg *m)
{
	memset(m, 0, sizeof *m);
	m->state = ST_PRE;
}

void sdb_rmsg_free(sdb_rmsg *m)
{
	free(m->hdr);
	m->hdr = NULL;
}

static int fail(sdb_rmsg *m, const char *why)
{
	sdb_rmsg_free(m);
	m->state = ST_FAILED;
	m->error = why;
	return -1;
}

int sdb_rmsg_feed(sdb_rmsg *m, const uint8_t *in, size_t len, sdb_rmsg_emit emit, void *arg)
{
	while (len > 0) {
		size_t n;
		switch (m->state) {
		case ST_PRE:
			n = sizeof m->pre - m->have;
			if (n > len)
				n = len;
			memcpy(m->pre + m->have, in, n);
			m->have += n;
			in += n;
			len -= n;
			if (m->have < sizeof m->pre)
				return 0;
			m->type = get64(m->pre);
			if (m->type < 1 || m->type > 6)
				return fail(m, "unknown Raft message type");
			if (get64(m->pre + 8) == 0 || get64(m->pre + 8) > SDB_RMSG_HEADER_MAX)
				return fail(m, "message header length out of range");
			m->hdr_len = (size_t)get64(m->pre + 8);
			m->hdr = malloc(sizeof m->pre + m->hdr_len);
			if (!m->hdr)
				return fail(m, "out of memory");
			memcpy(m->hdr, m->pre, sizeof m->pre);
			m->have = 0;
			m->state = ST_HDR;
			break;
		case ST_HDR: {
			const char *why;
			uint64_t payload;
			n = m->hdr_len - m->have;
			if (n > len)
				n = len;
			memcpy(m->hdr + sizeof m->pre + m->have, in, n);
			m->have += n;
			in += n;
			len -= n;
			if (m->have < m->hdr_len)
				return 0;
			if (sdb_rmsg_check_header(m->type, m->hdr + sizeof m->pre, m->hdr_len,
						  &payload, &why) != 0)
				return fail(m, why);
			if (emit(arg, m->hdr, sizeof m->pre + m->hdr_len) != 0)
				return fail(m, "write failed");
			sdb_rmsg_free(m);
			m->have = 0;
			m->left = payload;
			m->state = payload ? ST_PAYLOAD : ST_PRE;
			if (!payload)
				m->messages++;
			break;
		}
		case ST_PAYLOAD:
			n = m->left < len ? (size_t)m->left : len;
			if (emit(arg, in, n) != 0)
				return fail(m, "write failed");
			in += n;
			len -= n;
			m->left -= n;
			if (m->left == 0) {
				m->state = ST_PRE;
				m->messages++;
			}
			break;
		default:
			return -1;
		}
	}
	return 0;
}
