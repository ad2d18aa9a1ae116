/* A validator of libraft 0.15's Raft message stream (src/uv_encoding.c, src/uv_recv.c),
 * run by our transport (raft/transport.h) on every accepted connection that it bridges to
 * libraft, so that no malformed message ever reaches libraft's decoder.
 *
 * Why: libraft 0.15 trusts the peer. Its decoder reads the fixed fields of a message from
 * the header buffer whatever the header's declared length (a 1-byte RequestVote header is
 * read as 40 bytes), takes AppendEntries' entry count and lengths and InstallSnapshot's
 * configuration length from the wire without checking them against the header or the
 * payload, asserts on an empty configuration, and hands raft an AppendEntries whose
 * entries are all empty, or an InstallSnapshot without data, with pointers left over from
 * the previous message. Any TCP client that reaches the Raft port could crash a member.
 *
 * Stream layout (every integer u64 little endian unless said otherwise):
 *   preamble  type (1 AppendEntries, 2 AppendEntriesResult, 3 RequestVote,
 *             4 RequestVoteResult, 5 InstallSnapshot, 6 TimeoutNow) | header length
 *   header    RequestVote: term | candidate id | last index | last term [| flags]
 *                 (32 or at least 40 bytes: libraft reads the flags when the length is not 32)
 *             RequestVoteResult: term | granted [| flags]   (16 or at least 24)
 *             AppendEntriesResult, TimeoutNow: three u64    (at least 24)
 *             AppendEntries: term | prev index | prev term | commit | n | n x (term u64,
 *                 type u8 (1 command, 2 barrier, 3 change), 3 unused, length u32 LE)
 *                 (at least 40 + 16n; libraft sends 8 more unused bytes)
 *             InstallSnapshot: term | last index | last term | conf index | conf length |
 *                 conf (format u8 = 1 | n u64 | n x (id u64, address NUL-terminated,
 *                 role u8 0..2)) | data length   (at least 48 + conf length)
 *   payload   AppendEntries: the entries' data, each but the last padded to 8 bytes as
 *             libraft's decoder walks it (every entry must fit in the declared total);
 *             InstallSnapshot: the snapshot data (data length > 0). Others: none.
 *
 * Checked before any byte of a message is let through: the type, the header length
 * (> 0, at most SDB_RMSG_HEADER_MAX, at least what libraft reads for the type), the
 * entries (types, lengths > 0, within the payload), the configuration (bounds, NUL, role,
 * at least one server). The header is held back until it is checked; the payload then
 * flows through as it arrives (its length is fixed by the checked header).
 */
#ifndef SDB_RAFT_MSGCHECK_H
#define SDB_RAFT_MSGCHECK_H

#include <stddef.h>
#include <stdint.h>

#define SDB_RMSG_HEADER_MAX (64u << 20) /* bytes: 4 Mi entries in one AppendEntries */

typedef struct sdb_rmsg {
	int state;          /* internal */
	uint8_t pre[16];    /* the message preamble being read */
	size_t have;        /* bytes of the current step read */
	uint64_t type;
	uint8_t *hdr;       /* preamble + header, malloc'd while being read */
	size_t hdr_len;     /* header length */
	uint64_t left;      /* payload bytes still to pass through */
	uint64_t messages;  /* complete messages let through */
	const char *error;  /* static text once failed */
} sdb_rmsg;

/* Where checked bytes go (in order): returns 0, or non-zero to stop (the feed returns -1
 * with error "write failed"). */
typedef int (*sdb_rmsg_emit)(void *arg, const uint8_t *data, size_t len);

/* Start checking a stream (state zeroed). */
void sdb_rmsg_init(sdb_rmsg *m);

/* Feed len received bytes; emit gets the bytes that passed the checks, possibly in several
 * calls, never a byte of a message whose header has not been checked. Returns 0, or -1
 * once the stream is malformed (m->error says why; later feeds return -1 at once).
 * Errors: -1 (malformed stream, too long a header, emit failed, out of memory). */
int sdb_rmsg_feed(sdb_rmsg *m, const uint8_t *in, size_t len, sdb_rmsg_emit emit, void *arg);

/* Free what the checker holds (a partly read header). */
void sdb_rmsg_free(sdb_rmsg *m);

/* Check one message header (type, len header bytes, without the preamble) as above.
 * Returns 0 with *payload set to the payload length, or -1 with *why set (static text).
 * Errors: -1 (malformed). */
int sdb_rmsg_check_header(uint64_t type, const uint8_t *hdr, size_t len, uint64_t *payload,
			  const char **why);

#endif
