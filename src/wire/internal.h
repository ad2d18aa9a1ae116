/* Private state shared by src/wire/server.c, request.c, commands.c, currentop.c and
 * failpoint.c. Not for other folders:
 * roles use wire/server.h only. */
#ifndef SDB_WIRE_INTERNAL_H
#define SDB_WIRE_INTERNAL_H

#include <bson/bson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/metrics.h"
#include "tls/tls.h"
#include "wire/server.h"

/* A registered command with its metric series (looked up once at registration). */
typedef struct wire_cmd_entry {
	char *name;
	wire_cmd_fn fn;
	sdb_counter *ok;
	sdb_counter *error;
	sdb_histogram *duration;
} wire_cmd_entry;

/* Connection lifecycle. Allowed transitions (checked in debug builds):
 *   READING -> BUSY      a request was handed to a handler (reading goes on while nothing
 *                        is buffered, plaintext only: server.c conn_process, on_read)
 *   BUSY    -> READING   its reply was queued for writing (reading resumes)
 *   READING -> CLOSING, BUSY -> CLOSING   uv_close() called
 * Memory is released when the handle is closed AND no request refers to the connection
 * (refs reaches 0): a handler on another thread may still hold its request. */
enum wire_conn_state { WIRE_CONN_READING = 0, WIRE_CONN_BUSY, WIRE_CONN_CLOSING };

typedef struct wire_hello_wait wire_hello_wait;

/* The next getMore of a legacy exhaust cursor (OP_QUERY flag exhaust, msg.h): armed when
 * an OP_REPLY with a cursorID is queued (server.c send_reply), run by conn_process before
 * any message the client sent, so the client receives one OP_REPLY after another. */
typedef struct wire_exhaust {
	int64_t cursor_id;
	int32_t response_to;   /* requestID of the OP_REPLY just sent */
	int32_t batch;         /* batchSize of each getMore (0: the default) */
	int32_t starting_from; /* documents sent so far (OP_REPLY startingFrom) */
	char *db, *coll;       /* heap */
} wire_exhaust;
typedef struct wire_failpoint wire_failpoint;
typedef struct wire_ptw wire_ptw;

struct wire_conn {
	uv_tcp_t tcp;
	wire_server *srv;
	wire_conn *prev, *next;    /* srv->conns, while the handle is open */
	int64_t id;
	char peer[64];
	enum wire_conn_state state;
	int refs;                   /* 1 for the open handle + 1 per request; loop thread only */
	bool reading;               /* uv_read_start active */
	bool watch_eof;             /* BUSY but reading, to notice EOF (awaitable hello) */
	bool close_when_idle;       /* close once the queued replies are written */
	/* The client sends nothing more (TLS close_notify) but messages it sent before are
	 * buffered, whole: they still run, one at a time, and the connection closes (as
	 * close_when_idle) once none is left. Cleared by a request's close_after. */
	bool peer_done;
	size_t writes_pending;
	wire_req *inflight;
	uint8_t *rbuf;              /* bytes read and not yet consumed */
	size_t rlen, rcap;
	void *data;
	void (*data_free)(void *);
	/* issue #10: TLS (wire_server_opts.tls). tls_state: 0 undecided (first byte not
	 * seen), 1 plaintext, 2 TLS (tls set). */
	int tls_state;
	tls_conn *tls;
	/* A reply sent by the handler's thread (server.c wire__req_complete, issue #19): the
	 * socket, and whether the request in flight may send its reply so. direct_ok is set
	 * by the loop when it hands a plaintext connection with no queued writes a request,
	 * taken by the reply, and cleared by conn_close before the socket is closed; all
	 * under wmu, which the sender holds while it writes. */
	uv_os_fd_t fd;
	uv_mutex_t wmu;
	bool direct_ok;
	/* The loop waits on this connection's request (bytes or EOF arrived while it runs):
	 * its completion wakes the loop even when the reply went out. Under srv->mu. */
	bool want_done;
	wire_exhaust *exhaust;      /* a legacy exhaust cursor's next getMore, or NULL */
	/* Replies of pipelined messages held back while finish_done runs their successors
	 * (issue #19): written together, in one send, when the connection's run of
	 * pipelined messages ends or the pass does (server.c conn_write_rest, out_flush).
	 * Loop thread only. out_next: srv->out_conns, while out_queued. */
	uint8_t *out;
	size_t out_len, out_cap;
	bool out_queued;
	wire_conn *out_next;
};

/* The most top-level keys of a command wire_req_cmd_find indexes (a driver's find or
 * update has 6-10: the command, its arguments, $db, lsid, $clusterTime, txnNumber, ...). */
#define WIRE_REQ_KEYS 24

struct wire_req {
	wire_server *srv;
	wire_conn *conn;
	wire_req *next;           /* completion queue */
	wire_cmd_entry *entry;    /* metrics series */
	int32_t request_id;
	int32_t op_code;          /* WIRE_OP_MSG or WIRE_OP_QUERY: the reply format */
	int32_t reply_flags;      /* OP_REPLY responseFlags */
	bool no_reply;            /* moreToCome: run, but send nothing back */
	bool close_after;         /* close the connection once the reply is written */
	/* legacy OP_QUERY on a collection (or an exhaust cursor's getMore): the reply is a
	 * find/getMore reply sent as OP_REPLY documents (msg.h wire_msg_encode_cursor_reply) */
	bool legacy_cursor;
	bool exhaust;             /* OP_QUERY flag exhaust: stream the following batches */
	int32_t legacy_batch;     /* batchSize of the exhaust getMores (0: default) */
	int32_t starting_from;    /* documents of the cursor sent before this reply */
	char *coll;               /* legacy_cursor: the collection (heap) */
	bson_t *cmd;              /* heap: a bson_t member would force 128-byte alignment */
	char *name;
	char *db;
	uint64_t start_ns;
	bson_t *reply;
	bson_t *reply_extra;      /* fields appended to an ok reply (failCommand's
				   * writeConcernError), or NULL */
	atomic_int completed;
	atomic_int waiting;       /* wire_req_wait_begin minus _end: > 0 while the handler
				   * waits on I/O or a timer (reported so at a stop) */
	int32_t opid;             /* currentOp's opid (wire_req_opid), > 0 */
	atomic_int killed;        /* 1 killOp marked it (wire_req_kill), 2 past its maxTimeMS
				   * (wire_req_expire), else 0 */
	bool watch_close;         /* wire_req_watch_close: report the client's close (loop) */
	atomic_bool conn_gone;    /* the client closed the connection while it was in flight
				   * (watched: wire_req_conn_gone) */
	bool sent;                /* the reply went out from the handler's thread */
	uint8_t *out;             /* else, when the handler's thread tried: the encoded
				   * reply (heap), of which out_off of out_len bytes went out;
				   * the loop writes the rest */
	size_t out_len, out_off;
	/* detached requests (wire_req_detached_on_done) */
	void (*detached_done)(void *arg, wire_req *req);
	void *detached_arg;
	/* the command's top-level keys, indexed once cmd is whole (wire__req_index_cmd) for
	 * wire_req_cmd_find: key i's element begins at byte key_off[i] of cmd and its key is
	 * key_len[i] bytes. keys_indexed false: not indexed (not yet, or more than
	 * WIRE_REQ_KEYS keys), and lookups walk cmd. */
	bool keys_indexed;
	uint8_t n_keys;
	uint16_t key_len[WIRE_REQ_KEYS];
	uint32_t key_off[WIRE_REQ_KEYS];
};

/* Index req->cmd's top-level keys for wire_req_cmd_find. Call once req->cmd is whole and
 * before it can be looked at from another thread; cmd must not change afterwards. */
void wire__req_index_cmd(wire_req *req);

enum wire_srv_state { WIRE_SRV_RUNNING = 0, WIRE_SRV_DRAINING, WIRE_SRV_CLOSING };

struct wire_server {
	uv_loop_t *loop;
	uv_tcp_t listener;
	uv_async_t async;
	/* Requests completed ON the loop thread (a read run inline, a write applied by the
	 * loop's Raft apply, a built-in command) are finished by this idle handle, started
	 * by req_complete, at the next loop iteration: no eventfd write and read per
	 * request as through async (issue #19: 3 of a shard point read's 10 syscalls). An
	 * active idle handle keeps the loop from blocking, so the finish never waits for
	 * other I/O. */
	uv_idle_t finish;
	bool finish_active;
	/* finish_done is running: a reply whose connection has another whole message read
	 * (a pipelined one, which that pass runs next) is held in the connection's out
	 * buffer, and out_conns lists the connections holding some (wire_conn.out). */
	bool batching;
	wire_conn *out_conns;
	/* A request whose reply its handler's thread sent (req_complete) is finished
	 * lazily: put on the done list without waking the loop, and finished when the loop
	 * next wakes: its connection's next message or EOF (on_read), or any other event
	 * (this prepare handle, run before the loop blocks). The client has its reply; what
	 * waits is the loop's bookkeeping (the connection's state, n_outstanding), and
	 * metrics and currentOp are done at completion. lazy_ok: under mu, false once the
	 * server closes (every completion wakes the loop then). lazy_pending: some request
	 * was queued so. */
	uv_prepare_t drain;
	bool lazy_ok;
	atomic_bool lazy_pending;
	/* the thread running the loop: set at the first accepted connection (a loop
	 * callback), before any request of a connection exists */
	uv_thread_t loop_thread;
	bool loop_thread_known;
	uv_timer_t close_timer;
	enum wire_srv_state state;
	bool listener_open;
	int handles_closing;
	char *role;
	int max_connections;
	void *role_data;
	wire_hello_fn hello;
	wire_gate_fn gate;
	wire_ct_in_fn ct_in;
	wire_ct_out_fn ct_out;
	wire_gone_fn gone;
	bool is_mongos;
	wire_failpoint *fp;       /* failCommand setting; NULL without test commands */
	wire_ptw *ptw;            /* onPrimaryTransactionalWrite; NULL unless test commands
				   * and not a mongos */
	uint64_t quiesce_ms;      /* wire_server_close phase 2 */
	bool quiescing;           /* DRAINING, phase 2: commands still read (and refused) */
	uint64_t close_deadline;  /* uv_now() at which connections are force-closed */
	tls_listener *tls;        /* issue #10: the role's TLS listener (opts), or NULL */
	tls_mode tls_mode;        /* its mode (DISABLED: none) */
	int port;
	bson_oid_t process_id;    /* topologyVersion.processId */
	int64_t topology_counter; /* topologyVersion.counter */

	wire_cmd_entry **cmds;    /* each entry heap-allocated: requests keep pointers */
	size_t n_cmds, cap_cmds;
	wire_cmd_entry unknown;   /* metrics of unknown commands (cmd="unknown") */
	wire_cmd_entry invalid;   /* metrics of unparseable messages (cmd="invalid") */

	wire_conn *conns;
	size_t n_conns;
	size_t n_outstanding;     /* requests created and not yet completed on the loop */
	wire_hello_wait *hello_waits;

	uv_mutex_t mu;            /* guards done_head/done_tail, lazy_ok, conns' want_done */
	wire_req *done_head, *done_tail;

	void (*close_cb)(void *);
	void *close_arg;

	sdb_gauge *m_conns;
	sdb_gauge *m_running; /* requests created and not yet completed (req_complete):
			      * n_outstanding less those waiting for the loop's finish */
	sdb_counter *m_bytes_in;
	sdb_counter *m_bytes_out;
	sdb_counter *m_refused;
};

/* failpoint.c: the failCommand fail point (test commands, issue #16). */
wire_failpoint *wire__failpoint_new(void);
void wire__failpoint_free(wire_failpoint *fp);
wire_ptw *wire__ptw_new(void);
void wire__ptw_free(wire_ptw *p);
/* The configureFailPoint command (registered as a shared command; refused with
 * CommandNotFound when the server has no test commands). */
void wire__cmd_configure_fail_point(wire_req *req, void *role_data);
/* Before entry's handler runs: true when the fail point took req over (answered it, closed
 * the connection, or blocks and will call the handler itself); false to run the handler
 * now (maybe with req->reply_extra set). Loop thread. */
bool wire__failpoint_intercept(wire_req *req, wire_cmd_entry *entry);

/* currentop.c: the next opid (process-wide, > 0, wraps). Any thread. */
int32_t wire__next_opid(void);

/* server.c: complete req with reply (taken over; NULL only for a detached request's
 * error paths as before): metrics, then the reply is sent and the request finished (see
 * server.h). Any thread; exactly once per request (a second call aborts). */
void wire__req_complete(wire_req *req, bson_t *reply);
/* server.c: free a request (its command, reply, names, unsent reply bytes). */
void wire__req_free(wire_req *req);

/* server.c: a connection's life and output, shared with tls_io.c. Loop thread only. */
/* Close conn: its handle closes, held replies are written as far as the socket takes
 * them, no reply is sent from another thread after it. A no-op when closing already. */
void wire__conn_close(wire_conn *conn);
/* The client of conn closed it: tell the handler of a watched request in flight. */
void wire__conn_gone(wire_conn *conn);
/* Consume whole messages from conn's read buffer while the connection may run one. */
void wire__conn_process(wire_conn *conn);
/* Close conn if it has nothing left to do and the server drains or it was marked to
 * close once its reply is written (its held replies written first). */
void wire__conn_maybe_close_idle(wire_conn *conn);
/* Queue buf (len bytes, heap, taken over) on conn as is (no TLS). */
void wire__conn_write_raw(wire_conn *conn, uint8_t *buf, size_t len);

/* reply.c: a request's reply as bytes. */
/* Largest reply body a handler may produce: maxBsonObjectSize plus mongod's 16 KiB of
 * command-reply headroom. */
#define WIRE_MAX_REPLY_BSON (WIRE_MAX_BSON_SIZE + 16 * 1024)
/* req's reply as a message (heap, *len bytes): OP_REPLY to an OP_QUERY, else OP_MSG; one
 * over WIRE_MAX_REPLY_BSON becomes a BSONObjectTooLarge error. Any thread, but a legacy
 * cursor's reply (it arms the connection's exhaust stream) on the loop's only. */
uint8_t *wire__reply_encode(wire_req *req, size_t *len);
/* The handler's thread, conn->wmu held, req an OP_MSG whose reply is within
 * WIRE_MAX_REPLY_BSON: send it now as the message's prefix and the reply's own bytes (one
 * sendmsg, no copy). Sets req->sent, or leaves in req->out what the loop must write. */
void wire__reply_send_direct(wire_req *req);
/* Free an exhaust stream's state (NULL: nothing). */
void wire__exhaust_free(wire_exhaust *x);

/* tls_io.c (issue #10): TLS through memory BIOs. */
/* nread bytes just arrived at conn->rbuf + conn->rlen: the first decides plaintext or TLS
 * (a plaintext one refused and conn closed under --tls-mode=required); TLS records are
 * decrypted into the read buffer and run, a close_notify marks conn to close once its
 * replies are written. Returns true when they are plaintext for the normal path, false
 * when TLS consumed them (or the connection was closed). */
bool wire__tls_on_read(wire_conn *conn, size_t nread);
/* Queue buf (len bytes, heap, taken over) on conn, encrypted when the connection is TLS;
 * a failed encryption closes conn. */
void wire__conn_write(wire_conn *conn, uint8_t *buf, size_t len);
/* request.c: whether reply's `ok` field is true (absent: false). */
bool wire__reply_is_ok(const bson_t *reply);
/* commands.c: the registered command named name (isMaster/ismaster: hello), or NULL. */
wire_cmd_entry *wire__lookup(wire_server *srv, const char *name);
/* commands.c: register e's metric series, labelled with srv's role and cmd. */
void wire__entry_init_metrics(wire_server *srv, wire_cmd_entry *e, const char *cmd);
/* commands.c: register the shared commands (hello, ping, buildInfo, ...). */
void wire__register_builtins(wire_server *srv);
/* commands.c: append topologyVersion {processId, counter} (SDAM) to doc. Loop thread. */
void wire__append_topology_version(const wire_server *srv, bson_t *doc);
/* commands.c: answer every awaitable hello now (server closing). Loop thread. */
void wire__hello_flush(wire_server *srv);
/* commands.c: answer (into the void) the awaitable hellos of a connection that closed. */
void wire__hello_cancel_conn(wire_server *srv, wire_conn *conn);
/* server.c: read from a BUSY connection only to notice the peer closing (used while an
 * awaitable hello is held); bytes that arrive meanwhile are kept and reading stops. */
void wire__conn_watch_eof(wire_conn *conn);
/* Canonical command name for table lookup: "isMaster"/"ismaster" -> "hello". */
const char *wire__canonical_name(const char *name);

#endif
