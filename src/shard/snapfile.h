/* Snapshot installation for shard replica sets (issue #15).
 *
 * A shard member's Raft snapshot is a marker (src/shard/repl.c): the data is shard.db. A
 * member that needs a snapshot it does not hold (it was down while the others compacted
 * their logs, or it was just added) copies a consistent shard.db from another member:
 *   {stripedbSnapshotFile: "open", pageSize} -> {id, size, applied}: the source writes a
 *       consistent copy (sdb_store_copy_to: one read transaction, bounded memory) to
 *       DATA_DIR/snapshots/out-ID.db, at the receiver's store's page size pageSize
 *       (4096 when absent: a receiver of before 8 KiB pages, which installs no other
 *       size; a receiver of since converts what an older source sends);
 *   {stripedbSnapshotFile: "read", id, offset, length <= 8 MiB} -> {data: BinData,
 *       sha256: BinData}: one chunk and its SHA-256 (checked by the receiver);
 *   {stripedbSnapshotFile: "close", id}: the copy is deleted (copies left behind by a
 *       receiver that died are deleted 30 minutes later).
 * Cluster members only when --cluster-key-file is set (the wire gate), as every command.
 */
#ifndef SDB_SHARD_SNAPFILE_H
#define SDB_SHARD_SNAPFILE_H

#include <stdint.h>

#include "shard/shard.h"

/* The stripedbSnapshotFile command (worker thread). */
void shard_cmd_snapshot_file(shard_ctx *x);

/* Copy shard.db from the member at source ("H:P") into this member's store through conn
 * (sdb_store_replace_from), chunk by chunk through DATA_DIR/snapshots/in.db: memory stays
 * bounded by one 8 MiB chunk. The copy must have applied at least need_applied; *applied
 * gets its last applied Raft index. Blocking (libmongoc). Errors: with a message, SDB_EIO
 * (no client, the source's copy is older than need_applied, a transfer or local write
 * failed, and also a chunk whose checksum does not match: the message says so but the
 * code stays SDB_EIO), or what sdb_store_replace_from returns (SDB_ECORRUPT: the file is
 * not a store copy; SDB_EINVAL; SDB_EIO). */
int shard_snapshot_fetch(shard *sh, sdb_store_conn *conn, const char *source,
			 uint64_t need_applied, uint64_t *applied, char *err, size_t errlen);

#endif
