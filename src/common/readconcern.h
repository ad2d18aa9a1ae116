/* A command's readConcern as stripedb serves it (MongoDB: src/mongo/db/repl/
 * read_concern_args.cpp, the "Read Concern" spec), parsed the same way on a shard and on a
 * proxy so both refuse the same things with the same codes and messages (issue #20:
 * nothing accepted and ignored). Outside transactions only: a transaction's first
 * statement's readConcern is the transaction's (src/shard/txn.c, src/proxy/txnroute.c). */
#ifndef SDB_COMMON_READCONCERN_H
#define SDB_COMMON_READCONCERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <bson/bson.h>

/* What a readConcern asks for. level: NULL when absent, else one of "local", "available",
 * "majority", "linearizable" (points into the command: valid while it lives). */
typedef struct sdb_read_concern {
	const char *level;
	bool linearizable;
	uint32_t after_t, after_i; /* afterClusterTime Timestamp(t, i); both 0 when absent */
} sdb_read_concern;

/* Parse cmd's readConcern into *rc (zeroed first; no readConcern: all empty).
 * linearizable_ok: whether level "linearizable" is served by the caller (else refused).
 * Returns: 0, or MongoDB's code with the message in err (errlen bytes): 9 FailedToParse
 * (not an object, a level that is not a string or not a level, an unknown field),
 * 14 TypeMismatch (afterClusterTime not a Timestamp), 72 InvalidOptions (atClusterTime,
 * afterOpTime, level "snapshot" outside a transaction, "linearizable" on an aggregate whose
 * pipeline has $out or $merge: "$out cannot be used with a 'linearizable' read concern
 * level" as MongoDB, whatever linearizable_ok; "linearizable" when not linearizable_ok: not
 * built by stripedb). */
int sdb_read_concern_parse(const bson_t *cmd, bool linearizable_ok, sdb_read_concern *rc,
			   char *err, size_t errlen);
/* sdb_read_concern_parse of a readConcern the caller found: field is on cmd's readConcern
 * element, or NULL when cmd has none (a caller with an index of the command's keys,
 * wire_req_cmd_find, need not walk it again; cmd is still read for an aggregate's
 * pipeline). Returns: as sdb_read_concern_parse. */
int sdb_read_concern_parse_field(const bson_t *cmd, const bson_iter_t *field,
				 bool linearizable_ok, sdb_read_concern *rc, char *err,
				 size_t errlen);

#endif
