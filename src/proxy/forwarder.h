/* The proxy's event-driven forwarder (issue #19): point reads and small writes of
 * unsharded collections, and point reads and writes on `_id` of collections sharded on
 * `_id`, sent to their shard and answered by the proxy's loop thread itself, with no
 * request thread.
 *
 * Why: a request thread costs every proxied request a hand-off (the loop wakes a thread),
 * a context switch each way and a thread that sleeps in recv until the shard answers;
 * that was a third of the proxy's CPU per point read (tests/bench/README.md). Here the
 * loop sends the command on a non-blocking connection to the shard's primary and goes
 * on with other clients; the answer wakes the loop like any client's message.
 *
 * What it takes, on an unsharded collection (cached routing, primary shard known without
 * asking metadata), on a database no tenant owns (no quota or policy decision), while
 * shardconn knows the shard's primary member (its own connections, shardwire.h):
 *  - a `find` whose filter is one `_id` equality on a plain value, with only projection,
 *    limit, batchSize >= 1, singleBatch and the session / cluster-time / primary read
 *    preference fields besides;
 *  - an `update` of one statement {q: {_id: <plain value>}, u: <document>, upsert?,
 *    multi: false?}, a `delete` of one statement {q: {_id: <plain value>}, limit: 0 or
 *    1}, an `insert` of at most 256 KiB of documents, each with ordered, writeConcern,
 *    bypassDocumentValidation (not a delete), lsid, txnNumber and the cluster-time /
 *    primary read preference fields besides.
 * On a collection sharded on {_id: 1} or {_id: "hashed"} (cached routing), the same find
 * without a projection, update and delete, when the `_id` is not null, an update leaves
 * the shard key alone (route_update_changes_key) and a chunk holds the key
 * (route_chunk_of_doc: the one chunk route_target's exact point selects); not an insert
 * (px_do_insert routes each document and makes the missing _ids). They go to the chunk's
 * shard, built by the request threads' own code: read.c px_find_shard_cmd (with the
 * shard's version when it keeps filtering metadata, px_shard_mode, else the chunk's) and
 * write.c px_stmt_shard_cmd (the chunk's version, stmtId 0), and are answered as
 * px_do_find (the same cursor answer) and px_do_write (px_stmt_answer) answer them. A
 * StaleConfig answer (the routing moved, nothing ran) goes to a request thread, whose run
 * refreshes the routing and retries; a shard that answers it for want of filtering
 * metadata is remembered first (px_shard_mode_note), so the loop's next reads there go
 * per chunk. Sharded finds with a projection, inserts, and other shard keys are request
 * threads' (the projection is the proxy's own, read.c).
 * Everything else goes to a request thread as before (exec.c run_job), unchanged.
 *
 * What it sends and answers is what run_job's path does for such a command: for the find
 * (read.c px_do_find -> exec.c px_forward_cursor) the command without session fields,
 * with `$stripedbViewCheck {allow: []}`, the answer `{cursor: {id: 0, ns, firstBatch},
 * ok: 1}` from the shard's, a shard's error as px_reply_shard_error passes it on; for a
 * write (write.c px_do_write / px_do_insert -> exec.c forward_plain) the command with its
 * lsid and txnNumber when it is a retryable write, the answer as px_reply_write_result
 * gives it; both with the proxy's `$clusterTime` and `$db`, and every answer through
 * px_answer_send (a shard's state-change code masked). What run_job's path would send
 * again goes to a request thread, which runs the command from the start with the full
 * retry path, and that run is the one resend run_job's path makes:
 *  - a command that never reached the member whole (a failed send);
 *  - a refusal (wire_not_executed_code: it did not run);
 *  - for a find or a retryable write, also any other state-change answer, a connection
 *    that fails or closes, the socket timeout of the shard's URI (a find has no side
 *    effect; the shard answers a retryable write it already ran from its record);
 *  - a find's view (169, resent by run_view_checked) or an answer that is not one
 *    complete batch.
 * A non-retryable write that may have run (an interruption such as 11602, a connection
 * lost after the send, the socket timeout) is answered as px_shard_call answers an
 * unknown outcome it must not resend: the shard's interruption (masked), or
 * HostUnreachable without a label; so that it never is one without having run, an idle
 * connection the member already closed is dropped (a non-blocking MSG_PEEK, as
 * shardwire_command does) before a non-retryable write is sent on it. A command in flight
 * is a wait for its shard (wire_req_wait_begin), as a request thread's shard call; the
 * proxy's stop lets those finish on the loop (the wire server's stop waits for them).
 *
 * Connections: per shard member, taken from that member's idle own connections (opened
 * and authenticated by request threads) and kept by the loop for good (at most
 * PX_FORWARD_CONNS per member, besides the request threads' 64 in flight: at most 128
 * connections from one proxy to a member). A write goes alone on one, sent at once. The
 * finds of one round of the loop's I/O for one member go together on one (8 at most,
 * then another): queued as they come and sent in one send after the round (a uv_check
 * handle, and a uv_prepare one for those that come from other phases), and answered in
 * order, since a member runs a connection's messages one at a time (so only finds the
 * shard runs on its loop go together: a projection that computes or a command over
 * ~4 KiB, which a worker runs, would hold the finds behind it; such a find goes alone,
 * forwarder.c pipelinable_find); the shard answers
 * those it reads on its loop in one pass and one write (wire/server.c finish_done). A
 * shard then reads and writes its socket once per round of finds, not once per find:
 * with 16 clients the proxy made 0.56 sends per find, and proxy and shard CPU per
 * read fell ~10% (tests/bench/README.md). No command is added to a connection after its
 * send, and one connection's socket timeout covers its finds (all sent at once). Since
 * a member runs a connection's messages one at a time, a find it runs slowly (on a
 * worker: a document too large for its loop, a failCommand block) delays the ones sent
 * with it; hence the cap of 8, where 16 clients averaged under 2 finds per send. A
 * connection that fails fails every command on it, each as above (the finds to request
 * threads); finds that never went out whole (a failed or partial send) go to request
 * threads too. An idle one that becomes readable (the member closed it, or sent
 * something unasked) is closed and counted in stripedb_proxy_shard_wire_stale_total. A
 * retired member's entry goes once none of its connections is left.
 *
 * Metrics: stripedb_proxy_loop_commands_total (answered by the loop),
 * stripedb_proxy_loop_command_fallbacks_total (started on the loop, then handed to a
 * request thread), stripedb_proxy_loop_commands_in_flight,
 * stripedb_proxy_loop_find_sends_total (sends of finds: the finds per send is the
 * commands over it, less the writes), stripedb_proxy_loop_connections.
 *
 * Loop thread only, every function. */
#ifndef SDB_PROXY_FORWARDER_H
#define SDB_PROXY_FORWARDER_H

#include <stdbool.h>

#include "proxy/proxy.h"
#include "wire/server.h"

#define PX_FORWARD_CONNS 64 /* connections the loop keeps per shard member */

typedef struct px_forwarder px_forwarder;

/* A forwarder for p on p->loop (p->sc, p->rc, p->quota, p->srv set). Never fails
 * (allocation aborts). Returns: it (free with px_forwarder_stop then px_forwarder_free). */
px_forwarder *px_forwarder_new(proxy *p);

/* Send req (dispatched by the wire server to the proxy) from the loop when it is a command
 * the forwarder takes (see the top of this file); it is then answered by the loop or
 * handed to a request thread (px_exec_submit) later. fw NULL: never. Returns: true when
 * the forwarder took req (the caller does nothing more with it), false when the caller
 * submits it to a request thread. */
bool px_forward_try(px_forwarder *fw, wire_req *req);

/* From now on take no request; the idle connections are closed now, the busy ones once
 * their command is answered (the wire server's stop waits for it). For the proxy's stop,
 * before the wire server closes. NULL is a no-op. */
void px_forwarder_stop(px_forwarder *fw);

/* Free fw once its connections' handles are closed (at once, or by the last close
 * callback). After px_forwarder_stop. NULL is a no-op. */
void px_forwarder_free(px_forwarder *fw);

#endif
