/* The arguments of currentOp and killOp (issue #20), parsed as mongod 6.0 parses them, for
 * the shard (src/shard/currentop.c) and the proxy (src/proxy/currentop.c). Sources:
 * src/mongo/db/commands/current_op_common.cpp (CurrentOpCommandBase::run) and
 * kill_op_cmd_base.cpp (KillOpCmdBase::parseOpId). Depends on libbson only. */
#ifndef SDB_COMMON_CUROP_H
#define SDB_COMMON_CUROP_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* currentOp's options and filter. */
typedef struct sdb_curop_args {
	bool all;      /* $all: idle connections too */
	bool own_ops;  /* $ownOps: only the caller's own operations */
	bool truncate; /* $truncateOps (default true): commands over 1000 bytes truncated */
	bson_t filter; /* every other field but the command name, the generic arguments and
			* the ones listed in skip: a $match over the op documents */
} sdb_curop_args;

/* Parse cmd ({currentOp: 1, ...}) into a (a->filter initialised: bson_destroy it). skip:
 * NULL-terminated names of internal fields left out of the filter too (may be NULL).
 * test_commands: $truncateOps: false is honoured only with test commands, as on mongod.
 * Never fails (the filter is checked by whoever compiles it). */
void sdb_curop_args_parse(const bson_t *cmd, const char *const *skip, bool test_commands,
			  sdb_curop_args *a);

/* killOp's `op` as a local opid (mongod: a number, integral, within 32 bits).
 * Returns: 0 with *opid set, or a MongoDB error code with its message in err:
 *   4 NoSuchKey "Missing expected field \"op\"";
 *   14 TypeMismatch "\"op\" had the wrong type. Expected number, found <type>";
 *   2 BadValue for a fractional or non-finite number;
 *   26823 "invalid op : N. Op ID cannot be represented with 32 bits". */
int sdb_curop_parse_opid(const bson_t *cmd, int32_t *opid, char *err, size_t errlen);

#endif
