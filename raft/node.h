/* One metadata Raft member: libraft 0.15 with its libuv disk backend and our transport, the
 * SQLite state machine (raft/fsm.h), bootstrap, membership and the mitigations for
 * libraft 0.15 bugs described in raft/README.md.
 *
 * Everything here runs on the loop given to sdb_node_start (the metadata role's loop);
 * no function is thread-safe.
 *
 * Leadership: a member that wins an election first commits a barrier entry
 * (raft_barrier) in its term; only after the barrier applied does sdb_node_ready()
 * return true, and only then may it serve writes or linearizable reads
 * (dissertation §6.4: "a leader must commit an entry from its own term").
 */
#ifndef SDB_RAFT_NODE_H
#define SDB_RAFT_NODE_H

#include <bson/bson.h>
#include <raft.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "raft/fsm.h"
#include "raft/transport.h"

typedef struct sdb_node sdb_node;

/* The replicated state machine a member runs: libraft's raft_fsm (apply, snapshot,
 * restore) over impl, plus what the node needs around it. The default (sdb_node_opts.sm
 * NULL) is metadata's SQLite state machine (raft/fsm.h) at DATA_DIR/meta.db; a shard
 * replica set passes its own (src/shard/repl.c). Every callback runs on the loop.
 *   bind(impl, r): once after raft_init (may be NULL);
 *   take_result(impl): the result document of the entry applied last (bson_new'd,
 *     ownership to the caller) or NULL; read by a proposal's completion;
 *   last_applied(impl): the index of the entry applied last;
 *   close(impl): when the node is freed (may be NULL). */
typedef struct sdb_node_sm {
	struct raft_fsm *fsm;
	void *impl;
	void (*bind)(void *impl, struct raft *r);
	bson_t *(*take_result)(void *impl);
	uint64_t (*last_applied)(void *impl);
	void (*close)(void *impl);
} sdb_node_sm;

/* libraft's InstallSnapshot timeout of every member (metadata and shard), in election
 * timeouts (4 s at the default 1000 ms, 3 s at the shard's 750 ms): after it a leader
 * sends the snapshot again to a member that has not answered it (raft/node.c, where it
 * is set, says why four). */
#define SDB_NODE_SNAPSHOT_RESEND_ELECTIONS 4u

typedef struct sdb_node_opts {
	uint64_t id;                   /* raft server id, > 0 */
	const char *data_dir;          /* DIR: raft log in DIR/raft, state machine DIR/meta.db */
	const char *raft_addr;         /* "HOST:PORT" this member listens on for raft */
	const char *bootstrap;         /* "ID@HOST:PORT,..." or NULL (join later) */
	unsigned snapshot_threshold;   /* entries between snapshots; 0 = 1024 */
	unsigned election_timeout_ms;  /* 0 = 1000; heartbeat is a tenth of it */
	/* The Raft port's security (raft/transport.h): NULL = our transport in plaintext
	 * mode (libraft's wire format, every message checked by raft/msgcheck.h); else our
	 * authenticated/TLS transport with these options (copied). Either way an incoming
	 * connection is accepted only from a member of the current configuration, by id and
	 * address (a member whose configuration is still empty accepts any), and this member
	 * announces its address in the configuration (raft/README.md, "Foreign peers"). */
	const sdb_transport_opts *transport;
	/* The state machine (copied); NULL = metadata's. */
	const sdb_node_sm *sm;
	/* When set, a file created (empty, fsynced) when this start bootstrapped a new
	 * cluster: how the metadata role knows the cluster was created by this binary and
	 * may start at its newest op version (raft/migstate.h). NULL: none. */
	const char *bootstrap_marker;
	/* Called on the loop thread whenever the raft state, term, leader or readiness
	 * changed (checked once per loop iteration). May be NULL. */
	void (*on_change)(void *data);
	void *data;
} sdb_node_opts;

/* Create the data directories, open the state machine, bootstrap when the directory is
 * pristine and this id is in the bootstrap list (every member gets the same list, so the
 * configuration entry is identical; a member with state ignores the list), and start
 * raft. Errors: with a message, SDB_EINVAL (bad id/address/list), SDB_EIO (disk, state
 * machine, transport, bind).
 * On error, handles already opened are closed asynchronously: the caller must run the
 * loop (as the role runner does after a failed start) to release them. */
int sdb_node_start(uv_loop_t *loop, const sdb_node_opts *opts, sdb_node **out, char *err,
		   size_t errlen);

/* Stop raft and free everything; cb(arg) runs on the loop when done. Pending proposals
 * complete with SDB_ECANCELED before that. */
void sdb_node_close(sdb_node *n, void (*cb)(void *arg), void *arg);

struct raft *sdb_node_raft(sdb_node *n);
/* Metadata's state machine (NULL when the node runs another one, sdb_node_opts.sm). */
sdb_fsm *sdb_node_fsm(sdb_node *n);
uint64_t sdb_node_id(const sdb_node *n);

/* True when this member is the leader and its term's barrier has been applied. */
bool sdb_node_ready(sdb_node *n);
/* Current term and known leader (id 0 and NULL address when unknown). */
uint64_t sdb_node_term(sdb_node *n);
void sdb_node_leader(sdb_node *n, uint64_t *id, const char **raft_addr);

/* Completion of a proposal. status is 0 (result is the state machine's result document),
 * SDB_ENOTLEADER (lost leadership before commit: the outcome is unknown), SDB_ECANCELED
 * (shutdown) or SDB_EIO. result is a bson_new() document on status 0, NULL otherwise;
 * the callback takes ownership and frees it with bson_destroy. */
typedef void (*sdb_node_apply_cb)(void *arg, int status, bson_t *result);

/* Propose command op with args (copied) stamped with the leader's epoch ms clock and,
 * when rnd_len > 0, that many random bytes (the only sources of time and randomness
 * the state machine ever sees). Returns 0 (cb will fire exactly once). Errors:
 * synchronous, cb never fires: SDB_ENOTLEADER (not the ready leader), SDB_ENOMEM, or
 * libraft's refusal mapped by sdb_node_errno (SDB_ENOTLEADER, SDB_ECANCELED, SDB_EBUSY,
 * SDB_ETOOBIG, SDB_EIO ...). */
int sdb_node_propose(sdb_node *n, const char *op, const bson_t *args, sdb_node_apply_cb cb,
		     void *arg);

/* Linearizable read fence: cb(arg, 0) after a barrier in the current term applied on
 * this leader; SDB_ENOTLEADER otherwise. Same sync/async rule as propose. Errors:
 * synchronous, SDB_ENOTLEADER, or libraft's refusal mapped by sdb_node_errno. */
typedef void (*sdb_node_done_cb)(void *arg, int status);
int sdb_node_barrier(sdb_node *n, sdb_node_done_cb cb, void *arg);

/* Membership (dissertation §4.1, one server at a time). add: add id@raft_addr as a
 * spare then promote it to voter (it catches up first); remove: remove id; transfer:
 * hand leadership to id (0 = any up-to-date voter). cb status: 0, SDB_ENOTLEADER,
 * SDB_EINVAL (bad id), SDB_EBUSY (a change is in progress), SDB_ETIMEOUT (transfer did
 * not complete), SDB_EIO. Same sync/async rule as propose. Errors: synchronous, cb never
 * fires: SDB_ENOTLEADER (not the ready leader), or libraft's refusal mapped by
 * sdb_node_errno (SDB_EINVAL bad id or address, SDB_EBUSY a change in progress ...). */
int sdb_node_add(sdb_node *n, uint64_t id, const char *raft_addr, sdb_node_done_cb cb,
		 void *arg);
int sdb_node_remove(sdb_node *n, uint64_t id, sdb_node_done_cb cb, void *arg);
int sdb_node_transfer(sdb_node *n, uint64_t id, sdb_node_done_cb cb, void *arg);

/* Append hello's electionId for the current term: an ObjectId 7fffffff followed by the
 * term as 8 big-endian bytes, so that it grows with the term as mongod's does (drivers
 * compare (setVersion, electionId) to ignore a stale primary). */
void sdb_node_append_election_id(sdb_node *n, bson_t *out);

/* The member-address lookup of sdb_node_hello_info: the wire (MongoDB protocol) address
 * "host:port" of voter id, or NULL when unknown (the member is left out of hosts). The
 * string is borrowed; it must stay valid until the reply is built. */
typedef const char *(*sdb_node_wire_fn)(void *ctx, uint64_t id);

/* What a Raft-replicated role tells drivers in hello about itself (the replica-set
 * fields of MongoDB's hello command: setName, setVersion, hosts, me, primary,
 * isWritablePrimary/ismaster, secondary, electionId; Server Discovery and Monitoring
 * specification). All strings are borrowed for the duration of the call. */
typedef struct sdb_node_hello_info {
	const char *set_name;
	int32_t set_version;
	const char *me;	 /* this member's wire address */
	bool ready;	 /* a writable primary: leader with its own-term barrier applied */
	bool secondary;	 /* the value of "secondary" */
	sdb_node_wire_fn wire;
	void *ctx;
} sdb_node_hello_info;

/* Rewrite reply (a hello or legacy isMaster reply the shared wire layer built as if the
 * server were a standalone writable primary) so that isWritablePrimary (or ismaster when
 * cmd is the legacy isMaster) says writable. Other fields are kept. */
void sdb_hello_set_writable(const bson_t *cmd, bson_t *reply, bool writable);

/* Replace reply's writability with h->ready and append the replica-set fields from the
 * node's current configuration (voters only, in configuration order) and leader:
 * "primary" is the leader's wire address, left out when no leader is known or when this
 * member leads but is not ready yet; electionId only when ready. */
void sdb_node_hello(sdb_node *n, const bson_t *cmd, bson_t *reply, const sdb_node_hello_info *h);

/* Append the current raft configuration as an array of {id, raft, role} to out under
 * key. */
void sdb_node_append_config(sdb_node *n, bson_t *out, const char *key);

/* Map a libraft error code to an SDB_E* code. Returns: 0 for 0; SDB_ENOTLEADER
 * (NOTLEADER, LEADERSHIPLOST), SDB_ECANCELED (SHUTDOWN, CANCELED), SDB_EINVAL (BADID,
 * NOTFOUND, DUPLICATEID, DUPLICATEADDRESS, BADROLE, INVALID), SDB_EBUSY (CANTCHANGE,
 * BUSY), SDB_EUNAVAILABLE (NOCONNECTION), SDB_ENOMEM, SDB_ETOOBIG, SDB_EIO for the rest. */
int sdb_node_errno(int raft_rv);

/* Parse "ID@HOST:PORT,..." into conf (initialised by the caller). Errors: SDB_EINVAL with
 * a message (a malformed member, a duplicate id or address, an empty list); conf may
 * hold the members added before the bad one (raft_configuration_close frees them). */
int sdb_node_parse_members(const char *list, struct raft_configuration *conf, char *err,
			   size_t errlen);

#endif
