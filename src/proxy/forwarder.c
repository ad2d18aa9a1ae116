/* The proxy's event-driven forwarder of point reads and small writes (issue #19).
 * See proxy/forwarder.h. */
#include "proxy/forwarder.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/cmdopts.h"
#include "common/loopread.h"
#include "common/log.h"
#include "common/metrics.h"
#include "proxy/exec.h"
#include "proxy/merge.h"
#include "proxy/quota.h"
#include "proxy/shardconn.h"
#include "proxy/shardwire.h"
#include "proxy/txn.h"
#include "routing/route.h"
#include "wire/msg.h"

#define FW_FIRST_BUF 16384 /* a reply's first buffer: most point reads fit */
#define FW_INSERT_BYTES (256 * 1024) /* the largest insert command taken */
#define FW_PIPELINE 8 /* finds sent together on one connection, at most */

/* What the forwarder sends: a find, or a write and which. */
enum fw_kind { FW_FIND, FW_UPDATE, FW_DELETE, FW_INSERT };
/* A write's statements array (the cmd_table's stmts in exec.c). */
static const char *const stmts[] = {[FW_UPDATE] = "updates", [FW_DELETE] = "deletes",
				    [FW_INSERT] = "documents"};

typedef struct fw_conn fw_conn;

/* The loop's connections to one shard member (w: the member's own connections). */
typedef struct fw_member {
	shardwire *w;
	fw_conn *idle; /* singly linked through fw_conn.next */
	fw_conn *filling; /* taking this round's finds (fw_conn.out), or NULL */
	size_t n_conns; /* open: idle and busy */
} fw_member;

/* One command the loop sent, or is to send at the round's end (fw_flush), on a
 * connection, until it is answered or handed on. */
typedef struct fw_op {
	wire_req *req; /* the client's request */
	char *shard;   /* the shard's id (heap) */
	bool write;    /* req is a write (an update, a delete, an insert), else a find */
	bool update;   /* write: an update (else a delete or an insert) */
	bool sent;     /* on the wire (else in its connection's out) */
	route_coll *rc; /* a sharded collection's routing the command was built from (one
			 * reference), NULL when unsharded */
	proxy_txn txn; /* write: its session fields (views into req's command) */
	int32_t request_id; /* its message's; the answer's responseTo */
	struct fw_op *next; /* its connection's queue */
} fw_op;

/* One connection of the loop. Idle: in its member's idle list, polled for anything
 * readable (which closes it). Busy: in fw->busy, with its commands queued in the order
 * they are sent, which is the order the member answers them (a connection runs one
 * message at a time, wire/server.h): one write, or up to FW_PIPELINE finds sent together
 * at the end of the loop's round (fw_flush), never more commands after those. */
struct fw_conn {
	px_forwarder *fw;
	fw_member *m;
	int fd;
	int32_t request_id; /* the last one used */
	uv_poll_t poll;
	uv_timer_t timer;
	int handles; /* of poll and timer, not yet closed */
	bool closing;
	bool failed; /* its poll reported an error (and stopped), or it broke: never kept */
	fw_op *head, *tail; /* busy: its commands, oldest first */
	size_t n_ops;
	uint8_t *out; /* finds encoded this round, sent by fw_flush */
	size_t out_len, out_cap;
	bool queued; /* in fw->flush */
	fw_conn *flush_next;
	uint8_t *buf;  /* answers as they arrive */
	size_t got, cap;
	fw_conn *next, *prev; /* the member's idle list (next only), or fw->busy */
};

struct px_forwarder {
	proxy *p;
	fw_member **members;
	size_t n_members;
	fw_conn *busy;
	fw_conn *flush; /* connections with finds to send (fw_conn.queued) */
	uv_check_t check;     /* fw_flush after the round's I/O callbacks */
	uv_prepare_t prepare; /* and before the loop blocks (commands from other phases) */
	size_t n_open; /* conns whose handles are not all closed, and check and prepare */
	bool stopping, free_when_closed;
};

static sdb_counter *m_answered, *m_fallbacks, *m_find_sends;
static sdb_gauge *m_in_flight, *m_conns;

px_forwarder *px_forwarder_new(proxy *p)
{
	px_forwarder *fw = sdb_calloc(1, sizeof *fw);

	if (m_answered == NULL) { /* the loop thread: no race */
		m_answered = sdb_metrics_counter(
			"stripedb_proxy_loop_commands_total",
			"Point reads and writes the proxy's loop thread sent to their shard and "
			"answered itself, with no request thread (forwarder.h).",
			NULL);
		m_fallbacks = sdb_metrics_counter(
			"stripedb_proxy_loop_command_fallbacks_total",
			"Commands the loop thread sent to their shard and then handed to a "
			"request thread, which ran them again (an answer other than a complete "
			"batch, a failed or closed connection, a socket timeout, the proxy's "
			"stop).",
			NULL);
		m_find_sends = sdb_metrics_counter(
			"stripedb_proxy_loop_find_sends_total",
			"Sends of the loop's point finds to a shard member, each carrying the "
			"finds of one round of the loop for that member, at most 8 "
			"(forwarder.h).",
			NULL);
		m_conns = sdb_metrics_gauge(
			"stripedb_proxy_loop_connections",
			"Connections to shard members the proxy's loop thread holds (idle and "
			"busy; at most 64 per member).",
			NULL);
		m_in_flight = sdb_metrics_gauge(
			"stripedb_proxy_loop_commands_in_flight",
			"Commands sent by the proxy's loop thread and not answered yet.", NULL);
	}
	fw->p = p;
	uv_check_init(p->loop, &fw->check);
	uv_prepare_init(p->loop, &fw->prepare);
	fw->check.data = fw;
	fw->prepare.data = fw;
	fw->n_open = 2;
	return fw;
}

/* ---------- which reads ---------- */

/* May v be the value of an `_id` equality sent from the loop? A plain value: never an
 * operator document, an array (matches elements), a regular expression (matches by
 * pattern), JavaScript or a deprecated type. */
static bool plain_id(const bson_iter_t *v)
{
	switch (bson_iter_type(v)) {
	case BSON_TYPE_DOUBLE:
	case BSON_TYPE_UTF8:
	case BSON_TYPE_BINARY:
	case BSON_TYPE_OID:
	case BSON_TYPE_BOOL:
	case BSON_TYPE_DATE_TIME:
	case BSON_TYPE_NULL:
	case BSON_TYPE_INT32:
	case BSON_TYPE_TIMESTAMP:
	case BSON_TYPE_INT64:
	case BSON_TYPE_DECIMAL128:
		return true;
	default:
		return false;
	}
}

/* A whole number >= lo (int32, int64, or a double holding one). */
static bool count_at_least(const bson_iter_t *v, int64_t lo)
{
	double d;

	switch (bson_iter_type(v)) {
	case BSON_TYPE_INT32:
		return bson_iter_int32(v) >= lo;
	case BSON_TYPE_INT64:
		return bson_iter_int64(v) >= lo;
	case BSON_TYPE_DOUBLE:
		d = bson_iter_double(v);
		return d >= (double)lo && d <= 9007199254740992.0 && d == (double)(int64_t)d;
	default:
		return false;
	}
}

/* Is the filter at it exactly {_id: <plain value>}? */
static bool id_filter(const bson_iter_t *it)
{
	bson_iter_t f;

	return BSON_ITER_HOLDS_DOCUMENT(it) && bson_iter_recurse(it, &f) && bson_iter_next(&f) &&
	       strcmp(bson_iter_key(&f), "_id") == 0 && plain_id(&f) && !bson_iter_next(&f);
}

/* Is the $readPreference at it {mode: "primary"}, as drivers send it? Any other field or
 * mode is readpref.c's. */
static bool primary_read_pref(const bson_iter_t *it)
{
	bson_iter_t f;

	return BSON_ITER_HOLDS_DOCUMENT(it) && bson_iter_recurse(it, &f) && bson_iter_next(&f) &&
	       strcmp(bson_iter_key(&f), "mode") == 0 && BSON_ITER_HOLDS_UTF8(&f) &&
	       strcmp(bson_iter_utf8(&f, NULL), "primary") == 0 && !bson_iter_next(&f);
}

/* Is cmd a find the forwarder takes (forwarder.h)? *coll: its collection name. The
 * fields not listed here (sort, skip, hint, readConcern, collation, maxTimeMS, any
 * option of a transaction, stripedb's internal ones ...) leave the read to a request
 * thread, whose checks answer what is wrong with them. */
static bool point_find(const bson_t *cmd, const char **coll)
{
	bson_iter_t it;
	bool have_filter = false;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it) || !BSON_ITER_HOLDS_UTF8(&it) ||
	    strcmp(bson_iter_key(&it), "find") != 0)
		return false;
	*coll = bson_iter_utf8(&it, NULL);
	if (**coll == '\0')
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (strcmp(k, "filter") == 0) {
			if (!id_filter(&it))
				return false;
			have_filter = true;
		} else if (strcmp(k, "projection") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				return false;
		} else if (strcmp(k, "limit") == 0) {
			if (!count_at_least(&it, 0))
				return false;
		} else if (strcmp(k, "batchSize") == 0) {
			if (!count_at_least(&it, 1)) /* 0: a cursor left open */
				return false;
		} else if (strcmp(k, "singleBatch") == 0) {
			if (!BSON_ITER_HOLDS_BOOL(&it))
				return false;
		} else if (strcmp(k, "$readPreference") == 0) {
			if (!primary_read_pref(&it))
				return false;
		} else if (strcmp(k, "$db") != 0 && strcmp(k, "lsid") != 0 &&
			   strcmp(k, "$clusterTime") != 0) {
			return false;
		}
	}
	return have_filter;
}

/* May find cmd (point_find took it), sent as len bytes, share a connection with other
 * finds? Only one the shard answers on its loop (common/loopread.h, as the shard's
 * read_inline_candidate decides: a command of at most SDB_LOOP_READ_MAX_CMD_BYTES, a
 * plain projection): the shard runs a connection's messages one at a time, so a find it
 * hands to a worker (a projection that computes, a large command) would hold every find
 * sent after it on that connection. Such a find goes alone, as before finds were sent
 * together. */
static bool pipelinable_find(const bson_t *cmd, size_t len)
{
	bson_iter_t it, p;

	if (len > SDB_LOOP_READ_MAX_CMD_BYTES)
		return false;
	if (!bson_iter_init_find(&it, cmd, "projection"))
		return true;
	return BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &p) &&
	       sdb_projection_plain(&p);
}

/* Is the statement at st (an element of an update's `updates`) one the forwarder takes:
 * {q: {_id: <plain value>}, u: <a document of update operators or a replacement, no
 * JavaScript operator>, upsert?, multi: false?}? */
static bool point_update_stmt(bson_iter_t *st)
{
	bool have_q = false, have_u = false;

	while (bson_iter_next(st)) {
		const char *sk = bson_iter_key(st);
		bson_t u;

		if (strcmp(sk, "q") == 0) {
			if (!id_filter(st))
				return false;
			have_q = true;
		} else if (strcmp(sk, "u") == 0) {
			if (!sdb_bson_iter_doc(st, &u) || px_uses_js_ops(&u))
				return false;
			have_u = true;
		} else if (strcmp(sk, "upsert") == 0) {
			if (!BSON_ITER_HOLDS_BOOL(st))
				return false;
		} else if (strcmp(sk, "multi") == 0) {
			if (!BSON_ITER_HOLDS_BOOL(st) || bson_iter_bool(st))
				return false;
		} else {
			return false;
		}
	}
	return have_q && have_u;
}

/* The same for a delete's statement: {q: {_id: <plain value>}, limit: 0 or 1}. */
static bool point_delete_stmt(bson_iter_t *st)
{
	bool have_q = false, have_limit = false;

	while (bson_iter_next(st)) {
		const char *sk = bson_iter_key(st);

		if (strcmp(sk, "q") == 0) {
			if (!id_filter(st))
				return false;
			have_q = true;
		} else if (strcmp(sk, "limit") == 0) {
			if (!count_at_least(st, 0) || bson_iter_as_int64(st) > 1)
				return false;
			have_limit = true;
		} else {
			return false;
		}
	}
	return have_q && have_limit;
}

/* Is cmd (an update, a delete or an insert: kind) a write the forwarder takes
 * (forwarder.h)? An update or a delete of one statement on {_id: <plain value>}
 * (point_update_stmt, point_delete_stmt); an insert of documents at most FW_INSERT_BYTES
 * long in all (what one non-blocking send takes; write.c forwards an unsharded
 * collection's insert of up to 14 MB as is, as this does); besides, ordered,
 * writeConcern, bypassDocumentValidation, lsid and txnNumber (a retryable write when
 * both: proxy_txn_parse checks them), the cluster-time and primary read-preference
 * fields. *coll: its collection name. */
static bool point_write(const bson_t *cmd, enum fw_kind kind, const char **coll)
{
	static const char *const names[] = {[FW_UPDATE] = "update", [FW_DELETE] = "delete",
					    [FW_INSERT] = "insert"};
	bson_iter_t it, arr, st;
	bool have_stmts = false;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it) || !BSON_ITER_HOLDS_UTF8(&it) ||
	    strcmp(bson_iter_key(&it), names[kind]) != 0)
		return false;
	*coll = bson_iter_utf8(&it, NULL);
	if (**coll == '\0' || (kind == FW_INSERT && cmd->len > FW_INSERT_BYTES))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);

		if (strcmp(k, stmts[kind]) == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr) ||
			    !bson_iter_next(&arr))
				return false;
			do {
				if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
					return false;
				if (kind != FW_INSERT &&
				    (!bson_iter_recurse(&arr, &st) ||
				     !(kind == FW_UPDATE ? point_update_stmt(&st)
							 : point_delete_stmt(&st)) ||
				     bson_iter_next(&arr)))
					return false; /* one statement */
			} while (kind == FW_INSERT && bson_iter_next(&arr));
			have_stmts = true;
		} else if (strcmp(k, "ordered") == 0 ||
			   (strcmp(k, "bypassDocumentValidation") == 0 && kind != FW_DELETE)) {
			if (!BSON_ITER_HOLDS_BOOL(&it))
				return false;
		} else if (strcmp(k, "writeConcern") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				return false;
		} else if (strcmp(k, "$readPreference") == 0) {
			if (!primary_read_pref(&it))
				return false;
		} else if (strcmp(k, "$db") != 0 && strcmp(k, "$clusterTime") != 0 &&
			   strcmp(k, "lsid") != 0 && strcmp(k, "txnNumber") != 0) {
			return false;
		}
	}
	return have_stmts;
}

/* ---------- connections ---------- */

static void conn_close(fw_conn *c);
static void on_poll(uv_poll_t *h, int status, int events);

static void member_prune(px_forwarder *fw, fw_member *m)
{
	while (m->idle) {
		fw_conn *c = m->idle;
		m->idle = c->next;
		conn_close(c);
	}
	(void)fw;
}

/* The member entry of w, made when new. Members whose own connections were retired (a
 * shard re-registered, a new cluster key) lose their idle connections here, and their
 * entry once no connection of theirs is left. */
static fw_member *member_of(px_forwarder *fw, shardwire *w)
{
	fw_member *found = NULL;

	for (size_t i = 0; i < fw->n_members; i++) {
		fw_member *m = fw->members[i];
		if (m->w == w) {
			found = m;
		} else if (shardwire_retired(m->w)) {
			member_prune(fw, m);
			if (m->n_conns == 0) { /* no connection points to it any more */
				free(m);
				fw->members[i--] = fw->members[--fw->n_members];
			}
		}
	}
	if (found)
		return found;
	fw->members = sdb_realloc(fw->members, (fw->n_members + 1) * sizeof *fw->members);
	found = sdb_calloc(1, sizeof *found);
	found->w = w;
	fw->members[fw->n_members++] = found;
	return found;
}

static void fw_free_now(px_forwarder *fw)
{
	for (size_t i = 0; i < fw->n_members; i++)
		free(fw->members[i]);
	free(fw->members);
	free(fw);
}

static void on_handle_closed(uv_handle_t *h)
{
	fw_conn *c = h->data;
	px_forwarder *fw = c->fw;

	if (--c->handles > 0)
		return;
	close(c->fd);
	free(c->buf);
	free(c->out);
	free(c);
	if (--fw->n_open == 0 && fw->free_when_closed)
		fw_free_now(fw);
}

/* The close callback of fw's check and prepare handles. */
static void on_fw_handle_closed(uv_handle_t *h)
{
	px_forwarder *fw = h->data;

	if (--fw->n_open == 0 && fw->free_when_closed)
		fw_free_now(fw);
}

/* Take idle c out of its member's idle list. */
static void idle_remove(fw_conn *c)
{
	for (fw_conn **pp = &c->m->idle; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			c->next = NULL;
			return;
		}
}

/* Close c (idle, or busy with its commands already answered or handed on). */
static void conn_close(fw_conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	sdb_gauge_add(m_conns, -1);
	c->m->n_conns--;
	if (c->m->filling == c)
		c->m->filling = NULL;
	if (c->queued) {
		for (fw_conn **pp = &c->fw->flush; *pp; pp = &(*pp)->flush_next)
			if (*pp == c) {
				*pp = c->flush_next;
				break;
			}
		c->queued = false;
	}
	uv_close((uv_handle_t *)&c->poll, on_handle_closed);
	uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* An idle connection to m's member, or NULL (none idle, none of the member's own idle
 * ones to take, or PX_FORWARD_CONNS open). */
static fw_conn *conn_get(px_forwarder *fw, fw_member *m)
{
	fw_conn *c = m->idle;
	int32_t rid;
	int fd;

	if (c) {
		m->idle = c->next;
		c->next = NULL;
		return c;
	}
	if (m->n_conns >= PX_FORWARD_CONNS || (fd = shardwire_take_idle_fd(m->w, &rid)) < 0)
		return NULL;
	c = sdb_calloc(1, sizeof *c);
	c->fw = fw;
	c->m = m;
	c->fd = fd;
	c->request_id = rid;
	/* uv_poll_init_socket makes the socket non-blocking */
	if (uv_poll_init_socket(fw->p->loop, &c->poll, fd) != 0) {
		close(fd);
		free(c);
		return NULL;
	}
	uv_timer_init(fw->p->loop, &c->timer);
	c->poll.data = c;
	c->timer.data = c;
	c->handles = 2;
	sdb_gauge_add(m_conns, 1);
	m->n_conns++;
	fw->n_open++;
	return c;
}

/* Has the member closed idle c, or sent it something unasked (what the idle poll closes
 * it for, seen before that poll event is handled)? */
static bool conn_stale(fw_conn *c)
{
	char b;
	ssize_t k;

	do
		k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	while (k < 0 && errno == EINTR);
	return !(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

/* Queue o, a command for c's member, on c (busy from now on, in fw->busy): a wait for its
 * shard, bounded by its socket timeout, as a request thread's (shardconn_wait_begin): a
 * graceful stop that times out logs it as a wait, not as a request its handler forgot
 * (wire_req_wait_begin). */
static void op_queue(fw_conn *c, fw_op *o)
{
	px_forwarder *fw = c->fw;

	sdb_gauge_add(m_in_flight, 1);
	wire_req_wait_begin(o->req);
	if (c->tail)
		c->tail->next = o;
	else
		c->head = o;
	c->tail = o;
	if (c->n_ops++ == 0) {
		c->next = fw->busy;
		c->prev = NULL;
		if (fw->busy)
			fw->busy->prev = c;
		fw->busy = c;
	}
}

/* o (of c's queue) is answered or handed on: off the queue, its request forgotten (the
 * caller has it). keep false: c is not kept. When c has no command left: out of the busy
 * list, then back to its member's idle list (watched), or closed when a command's keep
 * was false, c failed, the forwarder stops or the member's own connections were retired. */
static void op_release(fw_conn *c, fw_op *o, bool keep)
{
	px_forwarder *fw = c->fw;

	sdb_gauge_add(m_in_flight, -1);
	wire_req_wait_end(o->req); /* op_queue's begin */
	for (fw_op **pp = &c->head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			if (c->tail == o)
				c->tail = prev;
			break;
		}
	c->n_ops--;
	free(o->shard);
	if (o->write)
		proxy_txn_free(&o->txn);
	if (o->rc)
		route_coll_unref(o->rc);
	free(o);
	if (!keep)
		c->failed = true;
	if (c->n_ops > 0)
		return;
	uv_timer_stop(&c->timer);
	if (c->prev)
		c->prev->next = c->next;
	else
		fw->busy = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = NULL;
	c->next = NULL;
	if (c->m->filling == c)
		c->m->filling = NULL;
	if (c->failed || fw->stopping || shardwire_retired(c->m->w)) {
		conn_close(c);
		return;
	}
	c->next = c->m->idle;
	c->m->idle = c;
}

/* ---------- one command ---------- */

static void op_send(fw_conn *c, fw_op *o, bool keep, px_answer *ans);

/* A request context for answering o's request the way its handler would (px_reply_*):
 * the fields those read. ans: where the answer is recorded (px_answer_send sends it). */
static void fw_ctx(fw_conn *c, fw_op *o, ctx *x, px_answer *ans)
{
	memset(x, 0, sizeof *x);
	memset(ans, 0, sizeof *ans);
	x->p = c->fw->p;
	x->req = o->req;
	x->ans = ans;
	x->cmd = wire_req_cmd(o->req);
	x->db = wire_req_db(o->req);
	if (o->write)
		x->txn = o->txn; /* a copy of the views: freed with o's */
}

/* The answer of o's sharded update or delete (cls, reply, neterr as px_stmt_answer
 * takes them), as px_do_write gives it, sent (keep: as op_release's). */
static void op_answer_stmt(fw_conn *c, fw_op *o, bool keep, const bson_t *reply, int cls,
			   const char *neterr)
{
	ctx x;
	px_answer ans;

	fw_ctx(c, o, &x, &ans);
	(void)px_stmt_answer(&x, o->update, reply, cls, neterr);
	op_send(c, o, keep, &ans);
}

/* Count o as answered by the loop; a sharded one also as the targeted request
 * px_do_find / px_do_write count (px_note_target: one chunk), here rather than when sent,
 * so that one handed to a request thread is counted once, by that thread. Before o's
 * release (which drops o->rc). */
static void count_answered(fw_conn *c, fw_op *o)
{
	sdb_counter_inc(m_answered);
	if (o->rc) {
		ctx x = {.p = c->fw->p};

		px_note_target(&x, o->rc, 1);
	}
}

/* Send the answer recorded in ans (fw_ctx) as o's request's one completion
 * (px_answer_send), after o is released (keep: as op_release's). */
static void op_send(fw_conn *c, fw_op *o, bool keep, px_answer *ans)
{
	wire_req *req = o->req;

	count_answered(c, o);
	op_release(c, o, keep);
	px_answer_send(req, ans);
}

/* Hand o's request to a request thread (px_exec_submit). failed: c failed, so the member
 * is no longer trusted as the shard's primary, and c is not kept. */
static void op_fallback(fw_conn *c, fw_op *o, bool failed, const char *why)
{
	px_forwarder *fw = c->fw;
	wire_req *req = o->req;

	sdb_debug("proxy: loop command handed to a request thread", "shard=%s why=\"%s\"",
		  o->shard, why);
	if (failed)
		(void)shardconn_forward_done(fw->p->sc, o->shard, c->m->w, NULL);
	sdb_counter_inc(m_fallbacks);
	op_release(c, o, !failed);
	px_exec_submit(fw->p, req);
}

/* c's connection failed after o was sent (a read or write error, a closed connection, a
 * malformed answer, the socket timeout): the member is no longer trusted as the shard's
 * primary. A read or a retryable write goes to a request thread (its resend), as does a
 * command never sent; a non-retryable write may have run, so it is answered as
 * px_shard_call answers an unknown outcome it must not resend (px_reply_write_result:
 * HostUnreachable, no label). */
static void op_failed(fw_conn *c, fw_op *o, const char *why)
{
	ctx x;
	px_answer ans;
	bson_t none = BSON_INITIALIZER;
	char msg[512];

	if (!o->write || o->txn.on || !o->sent) {
		op_fallback(c, o, true, why);
		return;
	}
	(void)shardconn_forward_done(c->fw->p->sc, o->shard, c->m->w, NULL);
	snprintf(msg, sizeof msg, "shard %s: %s: %s", o->shard, shardwire_host(c->m->w), why);
	if (o->rc) { /* send_stmt_v's network error */
		op_answer_stmt(c, o, false, &none, SHARDCONN_NET_ERR, msg);
		bson_destroy(&none);
		return;
	}
	fw_ctx(c, o, &x, &ans);
	(void)px_reply_write_result(&x, SHARDCONN_NET_ERR, &none, msg);
	bson_destroy(&none);
	op_send(c, o, false, &ans);
}

/* c failed (see op_failed): every command on it, oldest first; c closes after the last. */
static void conn_failed(fw_conn *c, const char *why)
{
	c->failed = true;
	while (c->head)
		op_failed(c, c->head, why);
}

/* The answer of o's write (ok: what reply says), as forward_plain gives it
 * (px_reply_write_result); what px_shard_call sends again goes to a request thread. */
static void op_answer_write(fw_conn *c, fw_op *o, const bson_t *reply, bool ok)
{
	int64_t code = ok ? 0 : px_get_int(reply, "code", 0);
	ctx x;
	px_answer ans;

	/* px_shard_call's resends: a refusal (it did not run), or any state change of a
	 * retryable write (the shard recognises the resend); an interruption of a
	 * non-retryable one (it may have run) is answered as it came (masked) */
	if (!ok && wire_state_change_code(code) && (o->txn.on || wire_not_executed_code(code))) {
		op_fallback(c, o, false, "a state change");
		return;
	}
	if (o->rc) {
		/* stmt_execute's: a StaleConfig refusal (nothing ran) is retried under newer
		 * routing, which the request thread's run does; anything else is answered */
		if (!ok && code == WIRE_ERR_STALE_CONFIG)
			op_fallback(c, o, false, "StaleConfig");
		else
			op_answer_stmt(c, o, true, reply, ok ? SHARDCONN_OK : SHARDCONN_CMD_ERR, "");
		return;
	}
	fw_ctx(c, o, &x, &ans);
	(void)px_reply_write_result(&x,
				    ok			       ? SHARDCONN_OK
				    : code == WIRE_ERR_STALE_CONFIG ? SHARDCONN_STALE
								    : SHARDCONN_CMD_ERR,
				    reply, "");
	op_send(c, o, true, &ans);
}

/* The answer to o, c's oldest command: msg, one complete message of len bytes (read
 * before it returns, which may release o and close c). The client's answer, or the
 * request handed on; a malformed answer fails c. */
static void op_answer(fw_conn *c, fw_op *o, const uint8_t *msg, size_t len)
{
	px_forwarder *fw = c->fw;
	bson_t reply, *out, cd;
	bson_iter_t it, cur;
	char err[256];
	int64_t id = -1;
	const char *ns = NULL;
	uint32_t nslen = 0, blen = 0;
	const uint8_t *batch = NULL;
	wire_req *req = o->req;

	bson_init(&reply);
	if (shardwire_parse_reply(msg, len, o->request_id, &reply, err, sizeof err) != 0) {
		bson_destroy(&reply);
		conn_failed(c, err);
		return;
	}
	bool ok = shardconn_forward_done(fw->p->sc, o->shard, c->m->w, &reply);
	if (o->write) {
		op_answer_write(c, o, &reply, ok);
		bson_destroy(&reply);
		return;
	}
	if (!ok) {
		int64_t code = px_get_int(&reply, "code", 0);
		bson_iter_t m;

		/* what run_job's path sends again: a state change (px_shard_call resends a
		 * read after any), a view (exec.c run_view_checked); a request thread runs it
		 * from the start, which is that one resend */
		if (wire_state_change_code(code) ||
		    (code == WIRE_ERR_COMMAND_ON_SHARDED_VIEW &&
		     bson_iter_init_find(&m, &reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&m) &&
		     strstr(bson_iter_utf8(&m, NULL), "resolvedView.ns=") != NULL)) {
			bson_destroy(&reply);
			op_fallback(c, o, false, "a state change or a view");
			return;
		}
		if (o->rc && code == WIRE_ERR_STALE_CONFIG) {
			/* merged_execute's StaleConfig: retried under newer routing (a request
			 * thread's run); a shard without filtering metadata is remembered, so
			 * that its reads go per chunk (scatter_open_once) */
			(void)px_shard_mode_note(o->rc, o->shard, &reply);
			bson_destroy(&reply);
			op_fallback(c, o, false, "StaleConfig");
			return;
		}
		/* any other error is answered as px_forward_cursor answers it */
		ctx x;
		px_answer ans;

		fw_ctx(c, o, &x, &ans);
		(void)px_reply_shard_error(&x, code == WIRE_ERR_STALE_CONFIG ? SHARDCONN_STALE
									   : SHARDCONN_CMD_ERR,
					   &reply, "");
		bson_destroy(&reply);
		op_send(c, o, true, &ans);
		return;
	}
	if (bson_iter_init_find(&it, &reply, "cursor") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &cur)) {
		while (bson_iter_next(&cur)) {
			const char *k = bson_iter_key(&cur);
			if (strcmp(k, "id") == 0 && BSON_ITER_HOLDS_INT(&cur))
				id = bson_iter_as_int64(&cur);
			else if (strcmp(k, "ns") == 0 && BSON_ITER_HOLDS_UTF8(&cur))
				ns = bson_iter_utf8(&cur, &nslen);
			else if (strcmp(k, "firstBatch") == 0 && BSON_ITER_HOLDS_ARRAY(&cur))
				bson_iter_array(&cur, &blen, &batch);
		}
	}
	if (id != 0 || ns == NULL || batch == NULL) {
		/* not one complete batch (a filter on _id returns at most one document, so
		 * this is not expected): a request thread runs it through a proxy cursor; a
		 * shard cursor left open here ends at the shard's idle timeout */
		sdb_warn("proxy: a loop read's answer was not one complete batch",
			 "shard=%s cursor_id=%lld", o->shard, (long long)id);
		bson_destroy(&reply);
		op_fallback(c, o, false, "not one complete batch");
		return;
	}
	/* as exec.c answer_cursor_wce answers a batch that ends the cursor */
	out = bson_new();
	bson_append_document_begin(out, "cursor", -1, &cd);
	BSON_APPEND_INT64(&cd, "id", 0);
	bson_append_utf8(&cd, "ns", -1, ns, (int)nslen);
	{
		bson_t arr;
		if (bson_init_static(&arr, batch, blen))
			bson_append_array(&cd, "firstBatch", -1, &arr);
	}
	bson_append_document_end(out, &cd);
	BSON_APPEND_DOUBLE(out, "ok", 1.0);
	bson_destroy(&reply);
	count_answered(c, o);
	op_release(c, o, true);
	wire_req_reply(req, out);
}

static void on_timeout(uv_timer_t *t)
{
	fw_conn *c = t->data;

	if (c->n_ops > 0 && !c->closing)
		conn_failed(c, "socket timeout");
}

/* Read what c's member sent. Busy: the answers, each to the oldest command left, until
 * none is left; idle: anything (a FIN, an RST, stray bytes) closes c. */
static void on_poll(uv_poll_t *h, int status, int events)
{
	fw_conn *c = h->data;

	(void)events;
	if (c->closing)
		return;
	if (c->n_ops == 0) {
		/* idle: the member closed it or says something unasked */
		shardwire_count_stale();
		idle_remove(c);
		conn_close(c);
		return;
	}
	/* an error (libuv reports POLLERR as UV_EBADF and stops the poll) may come with the
	 * answers already received: they are read first, as a request thread's blocking
	 * recv reads what arrived before a reset; only with nothing (more) to read is it the
	 * connection's failure. Either way the connection is not kept. */
	if (status < 0)
		c->failed = true;
	for (;;) {
		size_t want = FW_FIRST_BUF;
		ssize_t k;

		/* every whole answer read, each to the oldest command left */
		while (c->got >= WIRE_MSG_HEADER_LEN) {
			int32_t len = wire_msg_peek_length(c->buf);

			if (!wire_msg_length_ok(len) || (size_t)len < WIRE_MSG_HEADER_LEN) {
				conn_failed(c, "bad answer length");
				return;
			}
			if (c->got < (size_t)len) {
				if ((size_t)len > want)
					want = (size_t)len;
				break;
			}
			if (c->head == NULL || !c->head->sent) {
				/* more than was asked: the connection is broken */
				sdb_debug("proxy: a shard sent an answer to no command",
					  "shard=%s", shardwire_host(c->m->w));
				if (c->head) {
					conn_failed(c, "an answer to no command");
				} else {
					shardwire_count_stale();
					idle_remove(c);
					conn_close(c);
				}
				return;
			}
			op_answer(c, c->head, c->buf, (size_t)len); /* read before it returns */
			c->got -= (size_t)len;
			memmove(c->buf, c->buf + len, c->got);
			if (c->closing)
				return;
		}
		if (c->n_ops == 0) {
			if (c->got > 0) { /* bytes after the last answer */
				shardwire_count_stale();
				idle_remove(c);
				conn_close(c);
			} else if (c->cap > FW_FIRST_BUF) { /* a large answer's buffer is not kept */
				free(c->buf);
				c->buf = NULL;
				c->cap = 0;
			}
			return;
		}
		if (c->cap < want || c->cap == c->got) {
			size_t cap = want > c->got + FW_FIRST_BUF ? want : c->got + FW_FIRST_BUF;
			c->buf = sdb_realloc(c->buf, cap);
			c->cap = cap;
		}
		/* as much as the buffer holds: one recv for most answers, and for several
		 * finds sent together */
		do
			k = recv(c->fd, c->buf + c->got, c->cap - c->got, MSG_DONTWAIT);
		while (k < 0 && errno == EINTR);
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			if (status < 0) /* the poll stopped: no later event */
				conn_failed(c, uv_strerror(status));
			return; /* the rest comes with a later readable event */
		}
		if (k <= 0) {
			conn_failed(c, k == 0 ? "connection closed by the shard" : strerror(errno));
			return;
		}
		c->got += (size_t)k;
	}
}

/* Start c's reading of its answers and its socket timeout (that of w's URI). */
static void conn_sent(fw_conn *c)
{
	int ms = shardwire_socket_timeout_ms(c->m->w);

	if (!uv_is_active((uv_handle_t *)&c->poll))
		uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, on_poll);
	if (ms > 0 && !uv_is_active((uv_handle_t *)&c->timer))
		uv_timer_start(&c->timer, on_timeout, (uint64_t)ms, 0);
}

/* Send every connection's finds of this round, each connection's in one send (fw's check
 * and prepare callbacks). What does not reach the member whole goes to request threads:
 * a find has no side effect, so one that reached it whole and runs there as well does no
 * harm. */
static void fw_flush(px_forwarder *fw)
{
	while (fw->flush) {
		fw_conn *c = fw->flush;
		ssize_t k;
		int send_errno = 0;

		fw->flush = c->flush_next;
		c->flush_next = NULL;
		c->queued = false;
		if (c->m->filling == c)
			c->m->filling = NULL;
		if (c->closing || c->out_len == 0)
			continue;
		do
			k = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
		while (k < 0 && (send_errno = errno) == EINTR);
		if (c->out_cap > FW_FIRST_BUF) { /* a large find's buffer is not kept either */
			free(c->out);
			c->out = NULL;
			c->out_cap = 0;
		}
		if (k == (ssize_t)c->out_len) {
			sdb_counter_inc(m_find_sends);
			c->out_len = 0;
			for (fw_op *o = c->head; o; o = o->next)
				o->sent = true;
			conn_sent(c);
			continue;
		}
		sdb_debug("proxy: loop commands not sent", "host=%s err=\"%s\"",
			  shardwire_host(c->m->w), k < 0 ? strerror(send_errno) : "partial send");
		c->out_len = 0;
		/* only a failed connection says the member may not be the primary any more; a
		 * full send buffer (partial, EAGAIN) says nothing of it */
		if (k < 0 && send_errno != EAGAIN && send_errno != EWOULDBLOCK && c->head)
			(void)shardconn_forward_done(fw->p->sc, c->head->shard, c->m->w, NULL);
		c->failed = true;
		while (c->head)
			op_fallback(c, c->head, false, "not sent");
	}
	uv_check_stop(&fw->check);
	uv_prepare_stop(&fw->prepare);
}

static void on_check(uv_check_t *h)
{
	fw_flush(h->data);
}

static void on_prepare(uv_prepare_t *h)
{
	fw_flush(h->data);
}

/* ---------- a sharded collection's point commands ---------- */

/* The chunk of rc (a sharded collection) that cmd (a find, an update or a delete the
 * forwarder takes: point_find, point_write) pins exactly, or -1 when the loop does not
 * take it on rc: the shard key is not {_id: 1} or {_id: "hashed"}, the command is an
 * insert (px_do_insert routes each document and fills in missing _ids), a find has a
 * projection (px_do_find applies a sharded find's projection itself), the _id is null, an
 * update would change the shard key (write_stmt's refusal), or no chunk holds the key. */
static ssize_t sharded_point(const route_coll *rc, enum fw_kind kind, const bson_t *cmd)
{
	bson_t q, arr, st, u;
	bson_iter_t it;
	char err[256];

	if (kind == FW_INSERT || rc->nkeys != 1 || strcmp(rc->keys[0], "_id") != 0)
		return -1;
	if (kind == FW_FIND) {
		if (!px_get_doc(cmd, "filter", &q) || bson_has_field(cmd, "projection"))
			return -1;
	} else {
		if (!px_get_array(cmd, stmts[kind], &arr) || !bson_iter_init(&it, &arr) ||
		    !bson_iter_next(&it) || !sdb_bson_iter_doc(&it, &st) ||
		    !px_get_doc(&st, "q", &q))
			return -1;
		if (kind == FW_UPDATE &&
		    (!px_get_doc(&st, "u", &u) ||
		     route_update_changes_key(rc, &u, &q, err, sizeof err) != ROUTE_KEY_KEPT))
			return -1;
	}
	if (!bson_iter_init_find(&it, &q, "_id") || BSON_ITER_HOLDS_NULL(&it))
		return -1;
	return route_chunk_of_doc(rc, &q); /* route_target's exact point: one chunk */
}

/* Into sent (initialised): what px_do_find / px_do_write send for req's command (kind,
 * on coll) to chunk ci of rc, which sharded_point found: read.c's px_find_shard_cmd with
 * px_do_find's batch and limit, or write.c's px_stmt_shard_cmd with the write's session
 * fields (txn; NULL for a find). */
static void sharded_cmd(proxy *p, wire_req *req, route_coll *rc, size_t ci, enum fw_kind kind,
			const char *coll, const proxy_txn *txn, bson_t *sent)
{
	ctx x;
	bson_t q, arr;
	bson_iter_t it;

	memset(&x, 0, sizeof x);
	x.p = p;
	x.req = req;
	x.cmd = wire_req_cmd(req);
	x.db = wire_req_db(req);
	x.coll = coll;
	snprintf(x.ns, sizeof x.ns, "%s.%s", x.db, coll);
	if (txn)
		x.txn = *txn; /* views: the caller keeps txn */
	if (kind == FW_FIND) {
		/* px_do_find's: skip 0, limit and batchSize as given (point_find checked them) */
		int64_t limit = px_get_int(x.cmd, "limit", 0);
		int64_t batch = px_get_int(x.cmd, "batchSize", 101);

		(void)px_get_doc(x.cmd, "filter", &q);
		px_find_shard_cmd(&x, rc, ci, px_shard_mode(rc, rc->chunks[ci].shard), &q, NULL,
				  NULL, px_find_first_batch(0, limit, batch),
				  merge_pushdown_limit(0, limit), sent);
		return;
	}
	if (px_get_array(x.cmd, stmts[kind], &arr) && bson_iter_init(&it, &arr) &&
	    bson_iter_next(&it))
		(void)px_stmt_shard_cmd(&x, rc, ci, &it, kind == FW_UPDATE, sent);
}

bool px_forward_try(px_forwarder *fw, wire_req *req)
{
	proxy *p;
	const bson_t *cmd;
	const char *db, *coll;
	char ns[512], err[256], *shard;
	route_coll *rc;
	shardwire *w;
	fw_member *m;
	fw_conn *c;
	ssize_t ci = -1;

	proxy_txn txn;
	int code;

	if (fw == NULL || fw->stopping)
		return false;
	const char *name = wire_req_name(req);
	enum fw_kind kind;

	if (strcmp(name, "find") == 0)
		kind = FW_FIND;
	else if (strcmp(name, "update") == 0)
		kind = FW_UPDATE;
	else if (strcmp(name, "delete") == 0)
		kind = FW_DELETE;
	else if (strcmp(name, "insert") == 0)
		kind = FW_INSERT;
	else
		return false;
	bool write = kind != FW_FIND;
	p = fw->p;
	cmd = wire_req_cmd(req);
	db = wire_req_db(req);
	if (!(write ? point_write(cmd, kind, &coll) : point_find(cmd, &coll)) || db == NULL ||
	    strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 || strcmp(db, "local") == 0)
		return false;
	if ((size_t)snprintf(ns, sizeof ns, "%s.%s", db, coll) >= sizeof ns)
		return false;
	/* job_checks' option check; a tenant's quota or policy decision may block */
	if (sdb_cmd_unsupported_option(name, cmd, err, sizeof err) != 0 ||
	    proxy_quota_tenant_db(p->quota, db))
		return false;
	if ((rc = route_cache_get(p->rc, ns)) == NULL)
		return false; /* the first read of it loads its routing */
	if (rc->nkeys == 0) {
		route_coll_unref(rc);
		rc = NULL;
		if ((shard = proxy_db_primary_cached(p, db)) == NULL)
			return false;
	} else if ((ci = sharded_point(rc, kind, cmd)) < 0) {
		route_coll_unref(rc);
		return false;
	} else {
		shard = sdb_strdup(rc->chunks[ci].shard);
	}
	if ((w = shardconn_forward_target(p->sc, shard)) == NULL) {
		route_coll_unref(rc);
		free(shard);
		return false;
	}
	m = member_of(fw, w);
	/* job_checks' session-field check of a write (a malformed one is answered by a
	 * request thread) */
	if (write && !proxy_txn_parse(cmd, stmts[kind], &txn, &code, err, sizeof err)) {
		proxy_txn_free(&txn);
		route_coll_unref(rc);
		free(shard);
		return false;
	}
	/* A find goes with this round's other finds to the member (m->filling, at most
	 * FW_PIPELINE on one connection), sent together at the round's end (fw_flush): one
	 * send, and the member reads them at once and answers them in one write (wire
	 * server.c finish_done), where one connection per find cost each its own (issue
	 * #19). A write goes alone, now, on an idle connection: a shard applies a
	 * connection's commands one at a time, so writes queued on one connection would wait
	 * for each other's commit instead of sharing one.
	 *
	 * A non-retryable write sent on a connection the member already closed would be an
	 * unknown outcome although it never ran: as shardwire_command does before each send,
	 * an idle connection with anything to read (a FIN or RST whose poll event the loop
	 * has not handled yet in this iteration) is dropped first. Finds and retryable
	 * writes need no check: their failure goes to a request thread. */
	/* the shard's inline limit is on the command it gets, a little larger than the
	 * client's (shardconn_forward_finish, the view check): the client's with a margin */
	bool alone = !write && !pipelinable_find(cmd, (size_t)cmd->len + 512);

	if (!write && !alone && m->filling && m->filling->n_ops < FW_PIPELINE &&
	    !m->filling->closing) {
		c = m->filling;
	} else {
		while ((c = conn_get(fw, m)) != NULL && write && !txn.on && conn_stale(c)) {
			shardwire_count_stale();
			conn_close(c);
		}
	}
	if (c == NULL) {
		if (write)
			proxy_txn_free(&txn);
		route_coll_unref(rc);
		free(shard);
		return false; /* a request thread opens one (then idle for the next read) */
	}

	/* the command as run_job's path sends it: exec.c px_forward_cursor for a find, its
	 * forward_plain for a write (its session fields appended) */
	bson_t sent = BSON_INITIALIZER;
	uint8_t pre[WIRE_MSG_PREFIX_LEN];
	fw_op *o;

	if (rc) {
		sharded_cmd(p, req, rc, (size_t)ci, kind, coll, write ? &txn : NULL, &sent);
	} else {
		/* the one copy: without session fields, $db, $clusterTime */
		px_copy_cmd(cmd, &sent, NULL);
		if (!write)
			px_append_view_check(&sent, NULL, 0); /* point_find took no $stripedb* field */
		else if (txn.on) { /* a retryable write: the whole of it, its stmtId(s) as given */
			BSON_APPEND_DOCUMENT(&sent, "lsid", &txn.lsid);
			BSON_APPEND_INT64(&sent, "txnNumber", txn.txn);
		}
	}
	shardconn_forward_finish(p->sc, db, &sent);
	c->request_id = c->request_id == INT32_MAX ? 1 : c->request_id + 1;
	wire_msg_encode_msg_prefix(pre, c->request_id, 0, 0, sent.len);
	if (!write) {
		size_t need = sizeof pre + sent.len;

		if (c->out_cap - c->out_len < need) {
			size_t cap = c->out_cap ? c->out_cap : FW_FIRST_BUF;
			while (cap - c->out_len < need)
				cap *= 2;
			c->out = sdb_realloc(c->out, cap);
			c->out_cap = cap;
		}
		memcpy(c->out + c->out_len, pre, sizeof pre);
		memcpy(c->out + c->out_len + sizeof pre, bson_get_data(&sent), sent.len);
		c->out_len += need;
		bson_destroy(&sent);
		if (!c->queued) {
			if (fw->flush == NULL) {
				uv_check_start(&fw->check, on_check);
				uv_prepare_start(&fw->prepare, on_prepare);
			}
			c->queued = true;
			c->flush_next = fw->flush;
			fw->flush = c;
		}
		if (!alone) /* else no other find joins it */
			m->filling = c;
	} else {
		struct iovec iov[2];
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
		ssize_t k;
		int send_errno = 0;

		iov[0].iov_base = pre;
		iov[0].iov_len = sizeof pre;
		iov[1].iov_base = (void *)bson_get_data(&sent);
		iov[1].iov_len = sent.len;
		do
			k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		while (k < 0 && (send_errno = errno) == EINTR);
		bson_destroy(&sent);
		if (k != (ssize_t)(sizeof pre + iov[1].iov_len)) {
			/* nothing complete reached the member (a closed connection, or a send
			 * buffer too full for one command): it cannot have run; a request
			 * thread does it */
			sdb_debug("proxy: loop command not sent", "shard=%s err=\"%s\"", shard,
				  k < 0 ? strerror(send_errno) : "partial send");
			/* only a failed connection says the member may not be the primary any
			 * more; a command larger than the send buffer (partial, EAGAIN) says
			 * nothing of it */
			if (k < 0 && send_errno != EAGAIN && send_errno != EWOULDBLOCK)
				(void)shardconn_forward_done(p->sc, shard, w, NULL);
			proxy_txn_free(&txn);
			route_coll_unref(rc);
			free(shard);
			conn_close(c);
			return false;
		}
	}
	o = sdb_calloc(1, sizeof *o);
	o->req = req;
	o->shard = shard;
	o->write = write;
	o->update = kind == FW_UPDATE;
	o->sent = write;
	o->rc = rc; /* its reference */
	if (write)
		o->txn = txn;
	o->request_id = c->request_id;
	op_queue(c, o);
	if (write)
		conn_sent(c);
	return true;
}

void px_forwarder_stop(px_forwarder *fw)
{
	if (fw == NULL)
		return;
	fw->stopping = true;
	/* the commands in flight finish here (the wire server's stop waits for their
	 * answers): handing one to a request thread would run it again while the shard may
	 * still be running it */
	for (size_t i = 0; i < fw->n_members; i++)
		member_prune(fw, fw->members[i]);
}

void px_forwarder_free(px_forwarder *fw)
{
	if (fw == NULL)
		return;
	fw->free_when_closed = true;
	/* freed by the last close callback: its connections' and these two */
	uv_close((uv_handle_t *)&fw->check, on_fw_handle_closed);
	uv_close((uv_handle_t *)&fw->prepare, on_fw_handle_closed);
}
