/* Command options stripedb does not implement and must not silently ignore.
 *
 * MongoDB commands carry options that change what a command means: a collation changes how
 * strings compare, `let` defines variables for $expr, an update statement's `sort` picks the
 * document an updateOne changes (MongoDB 8.0). A server that does not implement one must refuse
 * the command rather than run it without the option (docs/compat.md lists every refusal).
 * Shared by the shard (before a worker runs the command) and the proxy (before it routes it,
 * since it builds shard requests of its own for some commands). Depends on libbson only. */
#ifndef SDB_COMMON_CMDOPTS_H
#define SDB_COMMON_CMDOPTS_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

/* Does the command `name` (cmd, its whole body, including an explained command and the
 * statements of update.updates, delete.deletes and createIndexes.indexes) use an option
 * stripedb does not implement?
 *   - collation other than {locale: "simple"} where stripedb does not honour it (issue #20:
 *     find, count, distinct, aggregate, findAndModify, create, the statements of
 *     update and delete and createIndexes' indexes honour it, also explained,
 *     storage/collation.h validates it there): in shardCollection and any other
 *     command: 238 NotImplemented;
 *   - top-level `let` on a command other than find, aggregate, update, delete and
 *     findAndModify (which honour it): 40415;
 *   - `sort` in an update statement: 40415 (unknown field, as MongoDB 6.0, the version we
 *     advertise, answers);
 *   - any top-level field that MongoDB 6.0's IDL does not define for find, aggregate, count,
 *     distinct, insert, update, delete, findAndModify and getMore (nor as a generic argument,
 *     generic_argument.idl), and any unknown field of an update or delete statement: 40415
 *     "BSON field 'find.x' is an unknown field." (strict parsing, as mongod; stripedb's own
 *     `$stripedb*` fields pass, the commands that read them check them);
 *   - a known field of the wrong type or value, as MongoDB 6.0's IDL parse refuses it (the
 *     table and the rules where stripedb is stricter are in cmdopts.c, "IDL types"), for
 *     find, aggregate, count, distinct, insert, update, delete, findAndModify, getMore,
 *     killCursors and their update/delete statements: 14 TypeMismatch "BSON field
 *     'find.filter' is the wrong type 'string', expected type 'object'"; an integer field
 *     through common/bsonget.h (14, 9 for a fractional double, 51024 below a `gte: 0`);
 *     maxTimeMS not a number in [0, INT32_MAX] or fractional: 2 BadValue (parseMaxTimeMS);
 *     a malformed writeConcern (w, wtimeout, j, fsync): 9 FailedToParse; a delete
 *     statement's limit other than 0 or 1: 9 "The limit field in delete objects must be 0
 *     or 1. Got 0.5"; getMore's batchSize <= 0: 2 BadValue;
 *   - a writeConcern (any, not parsed) on a command that never writes (find, getMore, count,
 *     distinct, killCursors, the listings and stats, ping/hello, currentOp, explain, an
 *     aggregate without $out/$merge): 72 InvalidOptions "Command does not support writeConcern", as
 *     mongod and mongos (service_entry_point_common.cpp);
 *   - a namespace string with a NUL byte inside (the first field when a string, `to`,
 *     `viewOn`, `$db`): 73 InvalidNamespace, as MongoDB (C strings would end at the NUL);
 *   - with a txnNumber (a retryable write), an update statement with multi: true or a delete
 *     statement with limit: 0: 72 InvalidOptions, as mongod answers (write_ops_exec.cpp),
 *     since a statement touching many documents cannot be recorded for an exactly-once retry.
 * Returns: 0 when the command is fine, else the MongoDB error code, with the message in err
 * (errlen bytes, NUL-terminated). Never fails otherwise; a malformed command is left to the
 * command itself. */
int sdb_cmd_unsupported_option(const char *name, const bson_t *cmd, char *err, size_t errlen);

/* sdb_cmd_unsupported_option, with internal: stripedb's own non-$ fields of find (keyRange,
 * stripedbSnapshot) and of a delete statement (keyRange, keyRangeLimit), which the
 * coordinator and backups send to shards, are known (a shard passes true; the proxy, whose
 * clients must not use them, false). Returns: as sdb_cmd_unsupported_option. */
int sdb_cmd_check(const char *name, const bson_t *cmd, bool internal, char *err, size_t errlen);

/* A writeConcern on a command that never writes: name is the command's name (hello for
 * isMaster), cmd the command. MongoDB 6.0 refuses it before the command runs
 * (service_entry_point_common.cpp: the invocation's supportsWriteConcern() is false);
 * sdb_cmd_check applies it to the roles' commands, the wire layer to its built-ins.
 * Returns: 0 when cmd has no writeConcern or the command takes one; else 72
 * InvalidOptions with "Command does not support writeConcern" in err (errlen bytes). */
int sdb_cmd_write_concern_check(const char *name, const bson_t *cmd, char *err, size_t errlen);

/* The API parameters of a command (MongoDB 6.0 initialize_api_parameters.cpp), checked by the
 * wire layer for every command of every role before it runs; name is the command's name
 * as sent (isMaster, findandmodify), cmd the command. stripedb's own commands (stripedb*)
 * are not checked, as mongod's internal commands are not.
 * Returns: 0, or with the message in err (errlen bytes): 14 TypeMismatch for an apiVersion
 * that is not a string or an apiStrict / apiDeprecationErrors that is not a bool; 4886600
 * for apiStrict or apiDeprecationErrors without apiVersion; 322 APIVersionError for an
 * apiVersion other than "1"; 323 APIStrictError for apiStrict: true on a command outside
 * API Version 1 (collStats, dbStats, serverStatus, ...). */
int sdb_cmd_api_check(const char *name, const bson_t *cmd, char *err, size_t errlen);

/* The checks of a command's top-level fields that every command of every role passes, in
 * one pass over them (the wire layer runs it before the command's handler): name is the
 * command's name as sent, cmd the command (an OP_MSG's document sequences appended).
 *   - a field that occurs twice: 40413 IDLDuplicateField "BSON field 'insert.ordered' is
 *     a duplicate field", as MongoDB's IDL parsers (idl_parser.cpp throwDuplicateField)
 *     refuse it, the first repeat in the command's order named. The command's name (its
 *     first field) is not counted: MongoDB's IDL skips it and answers a repeat of it as a
 *     field it does not define (40415), which is left to the command's own checks
 *     (sdb_cmd_check). Applied to every command, stripedb's own too; MongoDB applies it
 *     to the commands it parses with IDL (all of the CRUD and most others). Not refused:
 *     a repeat of lsid or $clusterTime, which libmongoc appends (its implicit session,
 *     its topology's cluster time) after a command of one role to another that carries
 *     its own; the first occurrence is the one used, as by every lookup;
 *   - then sdb_cmd_api_check's checks, on the fields' first occurrences.
 * Costs one walk of the top-level fields and a hash of each key (no allocation for a
 * command of up to 32 fields; a set grown on the heap past that, so a command of many
 * fields costs linear time). Returns: 0, or the code with the message in err (errlen
 * bytes). */
int sdb_cmd_fields_check(const char *name, const bson_t *cmd, char *err, size_t errlen);

/* Is field one of the generic arguments every command may carry (generic_argument.idl,
 * MongoDB 6.0: $db, lsid, maxTimeMS, comment, $readPreference ...)? currentOp leaves them
 * out of its filter, as mongod's CurrentOpCommandBase does. */
bool sdb_cmd_is_generic(const char *field);

#endif
