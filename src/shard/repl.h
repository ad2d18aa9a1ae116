/* Shard replica sets (issue #15): a shard is a Raft group of 1, 3 or 5 members on the same
 * integration as metadata (raft/node.h, canonical raft 0.15, pre-vote, own-term barrier),
 * whose state machine is the shard's store (storage/store.h). See src/shard/README.md,
 * "Replica sets", and the file comment of repl.c for the write path.
 *
 * Everything runs on the role's loop thread except shard_repl_submit (any thread).
 */
#ifndef SDB_SHARD_REPL_H
#define SDB_SHARD_REPL_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stdint.h>

#include "raft/node.h"
#include "shard/shard.h"

/* Start this member: open the apply connection, check the data directory against
 * --replica-set (a directory of another set, shard.db without its Raft log: SDB_EUSAGE),
 * and start Raft on --raft-listen with --bootstrap-members (none: a one-member set on an
 * ephemeral loopback port). wire_addr is this member's address for hello's hosts/me.
 * sh->repl is set even on error (close it with shard_repl_close). Errors: with a
 * message: SDB_EUSAGE (bad or inconsistent --replica-set, --raft-listen,
 * --bootstrap-members or --raft-tls; a data directory of another set), SDB_EINVAL (Raft
 * TLS files refused), SDB_EIO (the apply connection, the disk or the Raft port), or what
 * sdb_node_start returns. */
int shard_repl_start(shard *sh, const char *wire_addr, char *err, size_t errlen);
/* Refuse new writes, answer every write still waiting for its commit with
 * InterruptedAtShutdown (11600: outcome unknown), stop Raft and free; cb(arg) on the loop
 * when done. */
void shard_repl_close(shard_repl *r, void (*cb)(void *arg), void *arg);
/* Answer the writes waiting for their commit now (shutdown timeout) and refuse new ones. */
void shard_repl_abandon(shard_repl *r);
/* Hand the primary role to another up-to-date member (graceful stop: rolling restarts
 * without client errors). Errors: SDB_EINVAL when this is not a multi-member set, else as
 * sdb_node_transfer (synchronous: cb never fires). */
int shard_repl_transfer(shard_repl *r, sdb_node_done_cb cb, void *arg);

/* Queue a write command (checked by a worker) for the next Raft entry. The request is
 * answered with its command's reply once the entry applied here, NotWritablePrimary
 * (10107) when this member is not the primary when it proposes, or
 * InterruptedDueToReplStateChange (11602) / InterruptedAtShutdown (11600) when leadership
 * was lost or the member stopped before the commit (the outcome is unknown). Any thread. */
void shard_repl_submit(shard_repl *r, wire_req *req);
/* Queue the commit of a multi-document transaction (txn.h; ownership of t taken): at the
 * head of the next entry, validated when that entry is built (shard_txn_commit_build).
 * req is answered as for shard_repl_submit. Loop thread. */
struct shard_txn_rec;
void shard_repl_submit_txn(shard_repl *r, wire_req *req, struct shard_txn_rec *t);
/* Is this member the primary (the Raft leader whose term barrier applied)? */
bool shard_repl_writable(shard_repl *r);
/* The apply's store connection when a read may run on it now, else NULL (the set is
 * closing, or an apply or another read is open on it). Loop thread only, and the read
 * must end (sdb_store_rollback) before the loop thread does anything else. Reads on the
 * loop thread use it (src/shard/pool.c shard_pool_run_inline): it has applied every
 * committed write itself, so SQLite keeps its page cache and memory map across writes,
 * where every other connection drops both at its first read after any write (WAL mode:
 * perf showed that munmap and the page faults after it at 20% of a shard's CPU on YCSB A). */
sdb_store_conn *shard_repl_read_conn(shard_repl *r);
/* Write gate (loop thread): true when writable, else answers NotWritablePrimary. */
bool shard_repl_check_write(shard_repl *r, wire_req *req);
/* Read gate: on a named set a read on a non-primary needs a $readPreference other than
 * primary, else NotPrimaryNoSecondaryOk (13435). True when the read may run. */
bool shard_repl_check_read(shard_repl *r, wire_req *req);
/* readConcern of a read (loop thread): level local, available and majority run at once
 * (a member only applies committed entries); linearizable runs on the primary after a
 * barrier of its term committed (fn is then submitted to the pool), elsewhere
 * NotWritablePrimary; snapshot and atClusterTime are refused (InvalidOptions 72), other
 * levels FailedToParse (9). afterClusterTime T (issue #20): 72 above the member's
 * cluster time; on the primary at once; on a secondary whose newest applied oplog entry
 * is below T the read waits (without a worker) until the member applied T, asking the
 * primary for a no-op write above T meanwhile, bounded by maxTimeMS (50), killOp (11601)
 * and the stop (11600): repl_causal.c. True when the read may be submitted now; false
 * when it was answered or deferred. */
bool shard_repl_read_concern(shard_repl *r, wire_req *req, shard_cmd_fn fn);
/* killOp marked a request: answer it now if it is a read waiting for afterClusterTime
 * (repl_causal.c; otherwise within 50 ms). Loop thread. */
void shard_repl_reads_killed(shard_repl *r);
/* The start of a stop with a quiesce of ms: reads waiting for afterClusterTime answer
 * InterruptedAtShutdown (11600) by then unless their T applied first (ms <= 0: now), as
 * mongod interrupts waiting operations at shutdown. Loop thread. */
void shard_repl_reads_close_by(shard_repl *r, int64_t ms);
/* hello's replica-set fields (setName, hosts, primary, me, secondary, isWritablePrimary,
 * setVersion, electionId) when --replica-set is given; nothing otherwise. */
void shard_repl_hello(shard_repl *r, const bson_t *cmd, bson_t *reply);
/* {stripedbRegisterMember: <long id>, wire: "H:P"}: record a member's wire address in the
 * replicated member map (followers ask the primary; hello lists hosts from it). */
void shard_repl_cmd_register(shard_repl *r, wire_req *req);
/* The wire address of member id, or NULL when unknown. */
const char *shard_repl_member_wire(shard_repl *r, uint64_t id);

/* The set's name (--replica-set), NULL for a standalone-looking one-member set. */
const char *shard_repl_set_name(const shard_repl *r);
/* The member's Raft node (membership changes: members.c), NULL once stopping. */
sdb_node *shard_repl_node(shard_repl *r);
/* /healthz: a one-member set is healthy once primary, a member of a larger set while
 * it runs. False with a reason in msg otherwise. Any thread (atomics). */
bool shard_repl_healthy(shard_repl *r, char *msg, size_t msglen);
/* Append {setName, id, state, term, primaryId, primary, applied, commitIndex,
 * members: [{id, raft, role}], memberStatus: [...]} (memberStatus: shard_repl_view's
 * entries on the primary, each {id, host, raft, role, primary, self, matchIndex,
 * lagEntries, lagMillis, reachable, lastContactMillis}; on another member only {id, host,
 * raft, role, primary}: lag is known to the primary). Loop thread. */
void shard_repl_status(shard_repl *r, bson_t *out);

#define SHARD_REPL_MAX_MEMBERS 16

/* A multi-document delete (one statement with limit 0, no txnNumber, not a migration's)
 * is applied in parts, one Raft entry each, so that no member's loop thread stalls for
 * the whole delete (heartbeats wait for an apply): the primary adds this field (int64:
 * the most documents one part deletes) to the command it proposes, and proposes the
 * command again while a part deleted that many (repl.c). A client may not send it. As in
 * mongod, a multi-document delete is not isolated: other writes may run between parts. */
#define SHARD_DELETE_PART_FIELD "$stripedbApplyPart"
#define SHARD_DELETE_PART 1000
/* An insert of more documents than this (not in a transaction, not a migration's) is
 * proposed in parts of this many documents, one Raft entry each, for the same reason
 * (repl_parts.c): the next part after the previous applied (ordered: without a write
 * error), each document with the stmtId it has in the whole command, the reply merged
 * (n summed, writeErrors indexes of the whole command). Not isolated, as on mongod. */
#define SHARD_INSERT_PART 250

/* One member of the set as the primary sees it (shard_repl_view). */
typedef struct shard_member_view {
	uint64_t id;
	char host[256];  /* wire address from the replicated member map, "" unknown */
	char raft[256];  /* Raft address */
	const char *role; /* "voter", "standby" or "spare" (static) */
	bool primary;    /* this member is the primary (the one answering) */
	uint64_t match;  /* highest Raft index it is known to hold */
	int64_t lag_entries; /* the primary's last log index minus match (>= 0) */
	/* 0 when it holds the primary's whole log; else how long ago (wall ms) the primary
	 * appended the oldest entry it does not hold yet, i.e. how long it has been behind
	 * (MongoDB's optime lag, measured to now rather than to the primary's last write, so
	 * that it grows while a stopped member misses nothing but heartbeats); -1 unknown */
	int64_t lag_ms;
	bool reachable;  /* it answered the primary within the last election timeout */
	int64_t last_contact_ms; /* ms since its last answer seen (0 for the primary) */
} shard_member_view;

/* On the primary (the Raft leader): every member of the current configuration with its
 * replication progress, in configuration order; returns how many were written to out
 * (at most max), 0 when this member is not the leader. Loop thread. */
size_t shard_repl_view(shard_repl *r, shard_member_view *out, size_t max);

#endif
