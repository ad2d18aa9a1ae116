/* Session fields of the proxy's writes (issue #16, MongoDB "Retryable Writes"): the
 * client's lsid and txnNumber and each statement's stmtId, forwarded to the shards so that
 * a retried write (by the driver through any proxy, or by this proxy after a lost shard
 * connection) is recognised by the shard that executed it (src/shard/retry.c).
 *
 * stmtId of the client's statement i: stmtIds[i] when the command has `stmtIds`, else
 * `stmtId` + i (stmtId defaults to 0), as mongod's write_ops::getStmtIdForWriteAt. A batch
 * split across shards sends each shard `stmtIds` with the ORIGINAL ids of its statements.
 */
#ifndef SDB_PROXY_TXN_H
#define SDB_PROXY_TXN_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "wire/server.h"

typedef struct proxy_txn {
	bool on;      /* lsid and txnNumber given: the write is retryable */
	bson_t lsid;  /* static view into the client's command */
	int64_t txn;  /* txnNumber */
	int32_t base; /* stmtId of statement 0 without stmtIds */
	int32_t *ids; /* stmtIds (heap, n entries) or NULL */
	size_t n;
} proxy_txn;

/* Read the session fields of a write command cmd whose statements are the array field
 * stmts ("documents", "updates", "deletes"; NULL = one statement, findAndModify). Returns
 * false with a message (InvalidOptions 72 / TypeMismatch 14 in *code) when malformed.
 * Free with proxy_txn_free. */
bool proxy_txn_parse(const bson_t *cmd, const char *stmts, proxy_txn *t, int *code, char *err,
		     size_t errlen);
void proxy_txn_free(proxy_txn *t);
/* stmtId of the client's statement idx. */
int32_t proxy_txn_stmt_id(const proxy_txn *t, int64_t idx);
/* Append lsid, txnNumber and stmtIds [stmtId of idx[0..n)] to a shard command being built
 * (nothing when the write is not retryable). */
void proxy_txn_append(const proxy_txn *t, bson_t *cmd, const int64_t *idx, size_t n);

#endif
