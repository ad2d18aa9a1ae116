/* Connections from the proxy to shards and to the metadata service, and the worker
 * threads that run every blocking libmongoc call off the event loop.
 *
 * One mongoc_client_pool_t per shard (DESIGN.md §2: the same libmongoc code path for
 * embedded shards and MongoDB replica sets); its max size bounds the requests in flight
 * to that shard (SHARDCONN_MAX_INFLIGHT), protecting shards from a burst: a request beyond
 * it waits for a free client. Shard URIs come from the metadata service (listShards:
 * {id, uri}); the proxy adds serverSelectionTimeoutMS/connectTimeoutMS of
 * SHARDCONN_CONNECT_TIMEOUT_MS when the URI has none, so a shard that is down fails (after
 * the request's retry budget: the proxy's one retry path, retry.c px_shard_call) with an
 * error for its chunks only. This file is transport: one attempt per call, no retries.
 * Once libmongoc has selected a shard's primary and a command it sent there was answered,
 * that shard's primary commands go on the proxy's own connections to that member
 * (shardwire.h; issue #19: libmongoc's per-command cost) until a network error or a
 * not-primary answer hands the shard back to libmongoc (shardconn.c, "The own
 * connections"); the pool's client is still taken for each command, so both paths share
 * the in-flight bound.
 *
 * Threads: shardconn_submit() queues a job on the request pool (SHARDCONN_WORKERS threads);
 * shardconn_fanout() runs n sub-tasks of one request in parallel on a second pool (so a
 * request worker waiting for its sub-tasks can never starve them) and waits for all. Both
 * pools grow by one thread when a job is queued and none is idle (up to
 * SHARDCONN_MAX_WORKERS; threads above the base count exit after 30 s idle), so requests
 * stuck on an unreachable shard member (a primary cut off the network answers nothing
 * until the socket timeout) do not hold up the requests behind them. Pools ask for
 * heartbeatFrequencyMS=SHARDCONN_HEARTBEAT_MS unless the URI sets it, so a new primary is
 * found within about a second. On a shard whose URI makes a Single topology (one host, no
 * replicaSet) a primary command goes to the server id found by the first selection (until a
 * call fails), without selecting again.
 */
#ifndef SDB_PROXY_SHARDCONN_H
#define SDB_PROXY_SHARDCONN_H

#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/shardwire.h"
#include "wire/server.h"

#define SHARDCONN_WORKERS 16     /* request threads always running */
#define SHARDCONN_IO_WORKERS 32  /* fan-out threads always running */
#define SHARDCONN_MAX_WORKERS 256 /* either pool grows to this when requests wait */
#define SHARDCONN_MAX_INFLIGHT 64
#define SHARDCONN_CONNECT_TIMEOUT_MS 1000
#define SHARDCONN_HEARTBEAT_MS 1000

typedef struct shardconn shardconn;

/* Create the pools and start the threads. Never fails (allocation aborts). */
shardconn *shardconn_new(void);
/* Stop the threads (jobs already queued run first) and free everything. Call once no
 * job can be submitted any more. */
void shardconn_free(shardconn *sc);

/* Add or replace shard id with uri ("mongodb://..." or "HOST:PORT"). Errors: SDB_EINVAL
 * (unparsable URI) with a message. Thread-safe. */
int shardconn_set_shard(shardconn *sc, const char *id, const char *uri, char *err, size_t errlen);
/* True when shard id is known. */
bool shardconn_has_shard(shardconn *sc, const char *id);
/* The known shard ids, sorted (heap array of heap strings; free each and the array). */
size_t shardconn_shard_ids(shardconn *sc, char ***out);
/* Forget every shard whose id is not among ids[0..n) (a shard removed from the cluster: it
 * is no longer listed, targeted or chosen as a destination); its pool stays allocated until
 * shardconn_free, as clients may still be out. Any thread. */
void shardconn_retain_shards(shardconn *sc, char *const *ids, size_t n);

/* The hosts of shard id's URI as a connection string ("H:P" or "H:P,H:P"; scheme, user
 * information, database and options removed, so no credential is ever shown), for
 * explain's connectionString. Heap copy (free it) or NULL when id is unknown. */
char *shardconn_shard_hosts(shardconn *sc, const char *id);

/* Result classes of shardconn_command. */
enum {
	SHARDCONN_OK = 0,      /* reply has ok: 1 */
	SHARDCONN_CMD_ERR = 1, /* the shard answered ok: 0 (reply holds code/errmsg) */
	SHARDCONN_STALE = 2,   /* the shard answered StaleConfig (13388) */
	SHARDCONN_NET_ERR = 3, /* no answer: unknown shard, down, timeout (err says which) */
};

/* What a NET_ERR of shardconn_command says about cmd (its *fate). */
enum {
	SHARDCONN_ANSWERED = 0,        /* not a NET_ERR: the shard answered */
	SHARDCONN_UNSENT = 1,          /* never reached the shard: safe to send again */
	SHARDCONN_UNKNOWN_OUTCOME = 2, /* sent, then the connection failed: it may have run */
	SHARDCONN_UNREGISTERED = 3,    /* no such shard: nothing was sent, nothing to retry */
};

/* One attempt of cmd on shard id in database db (blocking: worker threads only); the
 * proxy's retry path (retry.c px_shard_call) decides whether to send it again.
 * *server_id: 0 = select a member (the primary, or by cmd's $readPreference) and store its
 * id (so getMore can follow the same server); non-zero = run on that server. reply is
 * always initialised (caller destroys). Returns: one of the SHARDCONN_* classes (not an
 * SDB_E* status); on NET_ERR,
 * err holds a message naming the shard and *fate says what became of cmd: UNSENT when no
 * server could be selected (connection refused or timed out) or the connection could not
 * be opened (a shard that is down or restarting), UNKNOWN_OUTCOME on any other network
 * error (reset or timeout after sending), UNREGISTERED for an unknown shard id;
 * otherwise *fate is ANSWERED. On CMD_ERR/STALE reply holds the shard's ok: 0 answer
 * (code, errmsg). */
int shardconn_command(shardconn *sc, const char *id, const char *db, const bson_t *cmd,
		      uint32_t *server_id, bson_t *reply, char *err, size_t errlen, int *fate);

/* Cluster-time gossip (issue #20, common/clustertime.h): the highest cluster time this
 * proxy has seen (shard replies, clients' $clusterTime), attached as $clusterTime to
 * every command shardconn_command sends (replacing the command's own) and raised by
 * every reply's. Any thread. Returns: the packed Timestamp (0: none seen yet); advance
 * raises it to time when higher and returns the value after. */
uint64_t shardconn_cluster_time(shardconn *sc);
uint64_t shardconn_advance_cluster_time(shardconn *sc, uint64_t time);

/* The document {$clusterTime: {clusterTime: ct, signature}} signed as ct_append signs
 * (the cluster key's secret, keyId 1; zeros and keyId 0 without a key), as a static view
 * in *out of this thread's copy: valid until this thread's next call. Kept per thread for
 * one key generation and one ct, so the secret is derived once per key (not under the key
 * file's mutex per command) and a time signed once (issue #19). Any thread. */
void shardconn_cluster_time_doc(uint64_t ct, bson_t *out);

/* The circuit state of shard id (false for an unknown shard): set by the retry path when a
 * retry budget was spent on the shard, cleared when it answers again, so the commands of a
 * shard that is down for good get one attempt instead of a budget each. Thread-safe. */
bool shardconn_shard_down(shardconn *sc, const char *id);
void shardconn_set_shard_down(shardconn *sc, const char *id, bool down);

/* Marker set in the reply of a NET_ERR that certainly did not execute the command. */
#define SHARDCONN_UNEXECUTED_FIELD "$stripedbUnexecuted"

/* True when reply (of a NET_ERR from px_shard_call) says the shard certainly did not
 * execute the command, so a client may safely retry it, even a write (the proxy then
 * labels the error RetryableWriteError). False on an unknown outcome. */
bool shardconn_unexecuted(const bson_t *reply);

/* Queue fn(arg) on a request worker. Thread-safe. */
void shardconn_submit(shardconn *sc, void (*fn)(void *arg), void *arg);

/* The client request the calling worker thread is running (the job runner sets it before
 * the handler and clears it with NULL after the answer), for shardconn_wait_begin/_end.
 * Thread-local; fan-out threads have none (the request's own thread waits for them). */
void shardconn_set_current_req(wire_req *req);
/* Bracket a wait that ends by itself (a call to a shard or to metadata, bounded by its
 * timeouts; a back-off; waiting for fan-out units) on the calling thread's current
 * request: wire_req_wait_begin/_end (wire/server.h), so that a graceful stop that times
 * out reports the request as waiting, not as unanswered. No-ops on a thread without a
 * current request. Every begin needs its end. */
void shardconn_wait_begin(void);
void shardconn_wait_end(void);
/* The client's deadline for the request the calling thread works for (monotonic ms; 0 =
 * none), from its maxTimeMS (MongoDB: the operation's deadline, which mongos applies to its
 * remote calls as well as forwarding maxTimeMS to the shards). While it is set, each
 * shardconn_command runs on a third pool and the caller waits for it at most until the
 * deadline: a shard that does not answer in time (stopped, cut off) gets the answer
 * MaxTimeMSExpired (50, CMD_ERR, fate ANSWERED) instead of holding the request until the
 * socket timeout (libmongoc's 5 minutes); a call made after the deadline is not sent. The
 * abandoned call goes on with its own copies (a write may still be applied when the shard
 * wakes up, as with mongos; its result is dropped) and counts in
 * stripedb_proxy_shard_calls_abandoned_total. At most SHARDCONN_MAX_INFLIGHT such calls run
 * per shard, abandoned ones included (a shard that stopped answering holds that many
 * threads, not the pool: calls to other shards still run); a call beyond waits for a slot
 * until its deadline, and a call still queued at its deadline is never sent. Thread-local like shardconn_set_current_req;
 * shardconn_fanout carries it to the fan-out units. */
void shardconn_set_op_deadline(uint64_t deadline_ms);
uint64_t shardconn_op_deadline(void);
/* Run fn(ctx, i) for i in [0, n) in parallel and return when all have finished: unit 0
 * on the calling thread (so n == 1 runs inline), the others on the I/O pool. The units
 * see the caller's shardconn_op_deadline. */
void shardconn_fanout(shardconn *sc, size_t n, void (*fn)(void *ctx, size_t i), void *ctx);

/* The shardconn's metadata pool, for the members "H:P,H:P" (replicaSet=stripedb-meta, so
 * the leader is found by libmongoc): made by shardconn_set_metadata (Errors: SDB_EINVAL
 * with a message on a bad address list; a second call replaces it), freed with the
 * shardconn.
 * shardconn_metadata returns the current pool (NULL before set): pop from it
 * and push back to the same pointer. Key rotation (issue #21): when the cluster key file
 * was reloaded with a new first key (auth_cluster_generation moved), this and every shard
 * pool are made anew with the new key at the next call or command; the old pools stay
 * alive (their connections are authenticated already) until shardconn_free. Thread-safe. */
int shardconn_set_metadata(shardconn *sc, const char *addrs, char *err, size_t errlen);
mongoc_client_pool_t *shardconn_metadata(shardconn *sc);

/* ---- the loop thread's forwarder (forwarder.h, issue #19) ----
 * The forwarder sends a shard's primary commands on its own non-blocking connections,
 * taken from the shard's own connections (shardwire.h), and only while shardconn knows
 * the primary member as the request threads' commands do (command_io's own-connection
 * path). Loop thread or any thread; none blocks. */

/* The own connections of shard id's primary member: the member a primary command of a
 * request thread would be sent to without libmongoc now. Returns: it, or NULL when such
 * a command would go through libmongoc (no primary learned, the URI needs libmongoc, the
 * shard marked down, a rotated cluster key not yet applied, an unknown shard). The
 * shardwire stays allocated until shardconn_free. */
shardwire *shardconn_forward_target(shardconn *sc, const char *id);

/* Make cmd (built by the caller with neither $clusterTime nor $db, e.g. by px_copy_cmd)
 * what the own connections send: the proxy's signed $clusterTime (as sent_cmd attaches
 * it) and $db (db) appended. */
void shardconn_forward_finish(shardconn *sc, const char *db, bson_t *cmd);

/* What a command sent on w (shard id's member) by the forwarder came to: reply is the
 * member's answer, or NULL when the connection failed (no complete answer). Counts the
 * command, raises the cluster time from the reply, and forgets w as the shard's primary
 * after a failure or a state-change answer (as command_wire does). Returns: true when
 * reply says ok: 1. */
bool shardconn_forward_done(shardconn *sc, const char *id, shardwire *w, const bson_t *reply);

#endif
