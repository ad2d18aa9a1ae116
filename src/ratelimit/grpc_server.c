/* gRPC server for pb.gubernator.V1 and PeersV1 on libnghttp2 and one libuv loop thread
 * (see grpc_server.h). nghttp2 does HTTP/2 (framing, HPACK, flow control, stream states);
 * this file does gRPC over it: the request headers (:path, content-type, grpc-timeout,
 * grpc-encoding), the 5-byte length prefix of messages, the response headers and the
 * grpc-status / grpc-message trailers (or one Trailers-Only HEADERS frame for an error),
 * as https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md describes. */
#include "build_config.h"
#include "ratelimit/grpc_server.h"
#include "ratelimit/membership.h"

#include <bson/bson.h>
#include <dlfcn.h>
#include <netdb.h>
#include <nghttp2/nghttp2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "auth/cluster.h"
#include "auth/raftsec.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/config.h"
#include "common/err.h"
#include "common/http.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/metrics.h"
#include "ratelimit/proto.h"
#include "tls/tls.h"

#define MAX_MESSAGE (4 * 1024 * 1024)  /* bytes of a request message, as gRPC's default */
#define MAX_STREAMS 256                /* concurrent calls per connection (SETTINGS) */
#define STREAM_WINDOW (1024 * 1024)    /* bytes: initial window of a stream */
#define CONN_WINDOW (16 * 1024 * 1024) /* bytes: window of a connection */
#define WRITE_HIGH (8 * 1024 * 1024)   /* queued output bytes above which reading pauses */
#define WRITE_LOW (1024 * 1024)        /* ... and below which it resumes */
#define CONN_BUFFERED (32 * 1024 * 1024) /* bytes of unfinished requests per connection */
#define CONN_BUDGET (64 * 1024 * 1024) /* bytes a connection may hold (requests, answer
					* slots, unsent answers, orphaned calls): beyond it
					* new streams are refused (RST_STREAM REFUSED_STREAM) */
#define MAX_HEADER_LIST (16 * 1024) /* SETTINGS_MAX_HEADER_LIST_SIZE: gRPC core's default
				     * metadata limit; RFC 9113 6.5.2 size (name+value+32) */
#define RESET_BURST 1000 /* RST_STREAMs a client may cause at once (nghttp2's default) */
#define RESET_RATE 33    /* ... and per second after the burst */
#define HANDSHAKE_MS 20000 /* default rl_grpc_server_opts.handshake_ms (gRPC core: 120 s) */
#define MAX_IDLE_MS 300000 /* default max_idle_ms */
#define MAX_CONNS 10000    /* default max_conns */
#define MAX_CONTINUATIONS 8 /* CONTINUATION frames of one header block (nghttp2's default) */

/* gRPC status codes (grpc/status.h) */
enum {
	ST_OK = 0,
	ST_INVALID_ARGUMENT = 3,
	ST_DEADLINE_EXCEEDED = 4,
	ST_PERMISSION_DENIED = 7,
	ST_RESOURCE_EXHAUSTED = 8,
	ST_OUT_OF_RANGE = 11,
	ST_UNIMPLEMENTED = 12,
	ST_INTERNAL = 13,
	ST_UNAVAILABLE = 14,
	ST_UNAUTHENTICATED = 16,
};

enum { M_GET_RATE_LIMITS, M_HEALTH_CHECK, M_LIVE_CHECK, M_GET_PEER, M_UPDATE_GLOBALS, M__COUNT };

static const char *const methods[M__COUNT] = {
	RL_METHOD_GET_RATE_LIMITS, RL_METHOD_HEALTH_CHECK, RL_METHOD_LIVE_CHECK,
	RL_METHOD_GET_PEER_RATE_LIMITS, RL_METHOD_UPDATE_PEER_GLOBALS,
};
/* The request message dispatch unpacks for each method that reads one (health and live
 * checks read none). */
static const ProtobufCMessageDescriptor *const requests[M__COUNT] = {
	[M_GET_RATE_LIMITS] = &pb__gubernator__get_rate_limits_req__descriptor,
	[M_GET_PEER] = &pb__gubernator__get_peer_rate_limits_req__descriptor,
	[M_UPDATE_GLOBALS] = &pb__gubernator__update_peer_globals_req__descriptor,
};
static const char *const method_labels[M__COUNT] = {
	"method=\"GetRateLimits\"", "method=\"HealthCheck\"", "method=\"LiveCheck\"",
	"method=\"GetPeerRateLimits\"", "method=\"UpdatePeerGlobals\"",
};

typedef struct h2conn h2conn;
typedef struct h2call h2call;

/* One HTTP/2 stream = one unary call. Owned by its connection until the stream closes;
 * a call whose decision is pending when its stream or connection goes away is orphaned
 * (conn NULL) and freed when the decision arrives (the cluster always completes). */
struct h2call {
	rl_grpc_server *srv;
	h2conn *conn; /* NULL: orphaned */
	h2call *prev, *next; /* in conn->calls */
	h2call *qnext;       /* in srv->done (decided on another thread) */
	int32_t id;
	int method; /* index into methods[], -1: unknown */
	int http_status; /* 200, or 405 / 415 for a request that is not gRPC */
	bool token_ok;   /* the cluster token header was present and right */
	bool enc_bad;    /* grpc-encoding other than identity */
	bool timeout_bad; /* a grpc-timeout that is not 1-8 digits and a unit */
	bool too_large;  /* request body over MAX_MESSAGE + 5, or over CONN_BUFFERED */
	bool deciding;   /* a cluster decision is pending */
	bool answered;   /* a response was submitted */
	bool hdr_too_large; /* request headers over MAX_HEADER_LIST */
	size_t hdr_size; /* RFC 9113 size of the request headers so far */
	uint64_t deadline_ns; /* monotonic, 0: none (grpc-timeout) */
	uint64_t start_ns;
	uint8_t *body;
	size_t blen, bcap;
	uv_timer_t *timer; /* deadline while deciding, or NULL */
	rl_resp *resps;
	size_t n;
	h2conn *acct; /* the connection whose budget counts held (also once orphaned), or NULL */
	size_t held;  /* bytes of answer slots and unsent answer counted in acct->held */
	uint8_t *out; /* the response message with its 5-byte prefix, freed once sent */
	size_t olen, opos;
	int status;
	char *msg; /* grpc-message, percent-encoded, or NULL */
};

struct h2conn {
	rl_grpc_server *srv;
	uv_tcp_t tcp;
	nghttp2_session *sess;
	tls_conn *tls; /* NULL: plaintext */
	h2conn *prev, *next;
	h2call *calls;
	h2call *orphans; /* calls whose stream closed while a decision is pending */
	size_t held;     /* bytes held by its calls' answer slots and unsent answers */
	uint8_t *obuf; /* output gathered before a write */
	size_t olen, ocap;
	bool closing;
	bool paused;
	size_t buffered; /* request bytes held by its calls (at most CONN_BUFFERED) */
	bool failed; /* nghttp2 refused the input (inside a TLS feed) */
	bool ready;  /* the client's preface and SETTINGS arrived (after TLS, when on) */
	uint64_t accepted_ns; /* monotonic */
	uint64_t active_ns;   /* monotonic: a stream opened or closed last */
};

struct rl_grpc_server {
	uv_loop_t loop;
	uv_tcp_t listener;
	uv_async_t wake;
	pthread_t thread;
	bool started; /* the loop thread runs */
	int port;
	tls_listener *tls; /* NULL: plaintext */
	nghttp2_session_callbacks *cbs;
	nghttp2_option *h2opt;
	h2conn *conns;
	size_t n_conns;
	uint64_t handshake_ns, idle_ns;
	size_t max_conns;
	uv_timer_t sweep; /* closes connections past their handshake or idle time */
	rl_cluster *cluster;
	pthread_rwlock_t fence; /* read: a handler uses cluster; write: shutdown fences it */
	bool fenced;
	bool shut;
	pthread_mutex_t mu; /* guards done, stop_req, exit_req */
	h2call *done;       /* decided on other threads, for the loop */
	bool stop_req, exit_req;
	bool listener_closed;
	uint8_t rbuf[65536]; /* read buffer of the loop thread (reads are handled at once) */
	sdb_counter *m_calls[M__COUNT];
	sdb_counter *m_bad;
	sdb_histogram *m_latency[M__COUNT];
	sdb_counter *m_decisions;
};

static const sdb_metric_def grpc_server_metrics[] = {
	SDB_METRIC_COUNTER(rl_grpc_server, m_bad, "stripedb_ratelimit_grpc_errors_total",
			   "gRPC calls answered with a non-OK status"),
	SDB_METRIC_COUNTER(rl_grpc_server, m_decisions, "stripedb_ratelimit_grpc_decisions_total",
			   "rate-limit answers sent over gRPC"),
};


/* ---- calls ---- */

static void call_unlink(h2call *c)
{
	h2conn *cn = c->conn;

	if (cn == NULL)
		return;
	cn->buffered -= c->blen;
	c->blen = 0;
	if (c->prev)
		c->prev->next = c->next;
	else
		cn->calls = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	c->conn = NULL;
	if (c->deciding && c->acct == cn) { /* still counted against cn: an orphan */
		c->next = cn->orphans;
		if (cn->orphans)
			cn->orphans->prev = c;
		cn->orphans = c;
	}
}

/* Bytes c holds now: its answer slots and the part of its answer not yet sent. */
static void call_account(h2call *c)
{
	size_t now = (c->resps ? c->n * sizeof(*c->resps) : 0) + (c->out ? c->olen - c->opos : 0);

	if (c->acct != NULL)
		c->acct->held = c->acct->held - c->held + now;
	c->held = now;
}

/* Stop counting c against its connection (c is being freed, or has left its stream with
 * no decision pending). */
static void call_unaccount(h2call *c)
{
	h2conn *cn = c->acct;

	if (cn == NULL)
		return;
	cn->held -= c->held;
	c->held = 0;
	c->acct = NULL;
	if (c->conn == NULL && (c->prev || c->next || cn->orphans == c)) { /* an orphan */
		if (c->prev)
			c->prev->next = c->next;
		else
			cn->orphans = c->next;
		if (c->next)
			c->next->prev = c->prev;
		c->prev = c->next = NULL;
	}
}

static void timer_free(uv_handle_t *h)
{
	free(h);
}

static void call_stop_timer(h2call *c)
{
	if (c->timer != NULL) {
		uv_close((uv_handle_t *)c->timer, timer_free);
		c->timer = NULL;
	}
}

/* Free c once nothing refers to it: its stream is gone and no decision is pending. */
static void call_maybe_free(h2call *c)
{
	if (c->conn != NULL || c->deciding)
		return;
	call_unaccount(c);
	call_stop_timer(c);
	free(c->body);
	free(c->resps);
	free(c->out);
	free(c->msg);
	free(c);
}

/* grpc-message is percent-encoded: bytes outside 0x20..0x7e and '%' (PROTOCOL-HTTP2.md). */
static char *pct_encode(const char *s)
{
	size_t n = strlen(s), i, k = 0;
	char *o = sdb_malloc(3 * n + 1);

	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch < 0x20 || ch > 0x7e || ch == '%')
			k += (size_t)sprintf(o + k, "%%%02X", ch);
		else
			o[k++] = (char)ch;
	}
	o[k] = '\0';
	return o;
}

#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), \
		  NGHTTP2_NV_FLAG_NO_COPY_NAME}

static ssize_t out_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
			uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	h2call *c = src->ptr;
	size_t left = c->olen - c->opos;
	char code[12];

	(void)ud;
	if (len > left)
		len = left;
	memcpy(buf, c->out + c->opos, len);
	c->opos += len;
	if (c->opos == c->olen) {
		free(c->out); /* nghttp2 has it in its frame: do not hold it until the stream ends */
		c->out = NULL;
		c->olen = c->opos = 0;
	}
	call_account(c);
	if (c->out == NULL) {
		nghttp2_nv tr[1] = {NV("grpc-status", "0")};
		if (c->status != ST_OK) {
			snprintf(code, sizeof code, "%d", c->status);
			tr[0] = (nghttp2_nv)NV("grpc-status", code);
		}
		*flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
		if (nghttp2_submit_trailer(s, id, tr, 1) != 0)
			return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	}
	return (ssize_t)len;
}

/* Answer c: status OK with the packed message in c->out (prefix included), or an error
 * status with details as one Trailers-Only HEADERS frame. Loop thread; the caller flushes
 * the connection (conn_flush) unless inside nghttp2's receive. */
static void reply(h2call *c, int status, const char *details)
{
	char code[12], hs[8];
	int rv;

	if (c->answered || c->conn == NULL)
		return;
	c->answered = true;
	c->status = status;
	if (status != ST_OK && c->method >= 0)
		sdb_counter_inc(c->srv->m_bad);
	if (c->method >= 0 && c->start_ns)
		sdb_histogram_observe_ns(c->srv->m_latency[c->method], sdb_mono_ns() - c->start_ns);
	if (status == ST_OK && c->out != NULL) {
		nghttp2_nv h[2] = {NV(":status", "200"), NV("content-type", "application/grpc")};
		nghttp2_data_provider dp;
		dp.source.ptr = c;
		dp.read_callback = out_read;
		rv = nghttp2_submit_response(c->conn->sess, c->id, h, 2, &dp);
	} else {
		nghttp2_nv h[5] = {NV(":status", ""), NV("content-type", "application/grpc"),
				   NV("grpc-status", ""), NV("grpc-accept-encoding", "identity"),
				   NV("grpc-message", "")};
		size_t nh = 3;
		snprintf(code, sizeof code, "%d", status);
		snprintf(hs, sizeof hs, "%d", c->http_status);
		h[0] = (nghttp2_nv)NV(":status", hs);
		h[2] = (nghttp2_nv)NV("grpc-status", code);
		if (c->enc_bad)
			h[nh++] = (nghttp2_nv)NV("grpc-accept-encoding", "identity");
		if (details && *details) {
			c->msg = pct_encode(details);
			h[nh] = (nghttp2_nv)NV("grpc-message", c->msg);
			nh++;
		}
		rv = nghttp2_submit_response(c->conn->sess, c->id, h, nh, NULL);
	}
	if (rv != 0)
		sdb_debug("grpc: could not submit a response", "err=%s", nghttp2_strerror(rv));
}

/* Set c->out to msg packed behind the 5-byte gRPC prefix. */
static void set_out(h2call *c, const ProtobufCMessage *msg)
{
	size_t n = protobuf_c_message_get_packed_size(msg);

	c->out = sdb_malloc(n + 5);
	c->out[0] = 0;
	c->out[1] = (uint8_t)(n >> 24);
	c->out[2] = (uint8_t)(n >> 16);
	c->out[3] = (uint8_t)(n >> 8);
	c->out[4] = (uint8_t)n;
	c->olen = 5 + protobuf_c_message_pack(msg, c->out + 5);
	c->opos = 0;
	call_account(c);
}

/* Serialise the GetRateLimits or GetPeerRateLimits answer held in c->resps and send it. */
static void reply_resps(h2call *c)
{
	rl_pb_resp slot1 = {0}, *slots = c->n <= 1 ? &slot1 : sdb_calloc(c->n, sizeof(*slots));
	Pb__Gubernator__RateLimitResp *ptr1 = NULL, **ptrs = c->n <= 1 ? &ptr1 : sdb_calloc(c->n, sizeof(*ptrs));
	size_t i;

	for (i = 0; i < c->n; i++) {
		rl_proto_resp_to_pb(&c->resps[i], &slots[i]);
		ptrs[i] = &slots[i].msg;
	}
	if (c->method == M_GET_RATE_LIMITS) {
		Pb__Gubernator__GetRateLimitsResp m = PB__GUBERNATOR__GET_RATE_LIMITS_RESP__INIT;
		m.n_responses = c->n;
		m.responses = ptrs;
		set_out(c, &m.base);
	} else {
		Pb__Gubernator__GetPeerRateLimitsResp m =
			PB__GUBERNATOR__GET_PEER_RATE_LIMITS_RESP__INIT;
		m.n_rate_limits = c->n;
		m.rate_limits = ptrs;
		set_out(c, &m.base);
	}
	if (ptrs != &ptr1)
		free(ptrs);
	if (slots != &slot1)
		free(slots);
	free(c->resps); /* packed: the slots are not needed while the answer waits to go */
	c->resps = NULL;
	call_account(c);
	sdb_counter_add(c->srv->m_decisions, c->n);
	reply(c, ST_OK, NULL);
}

static void conn_flush(h2conn *cn);

/* A decision finished, on the loop thread. */
static void call_decided(h2call *c)
{
	h2conn *cn = c->conn;

	call_stop_timer(c);
	if (cn != NULL && !c->answered) {
		reply_resps(c);
		conn_flush(cn); /* may close the stream: c stays while deciding */
	}
	c->deciding = false;
	call_maybe_free(c);
}

/* rl_cluster_done_fn: on the loop thread (every key local: inside
 * rl_cluster_decide_async) or on a peer completion thread, which hands c to the loop. */
static void on_decided(void *arg)
{
	h2call *c = arg;
	rl_grpc_server *srv = c->srv;

	if (pthread_equal(pthread_self(), srv->thread)) {
		c->deciding = false;
		call_stop_timer(c);
		if (c->conn != NULL && !c->answered)
			reply_resps(c); /* inside nghttp2's receive: flushed after it */
		call_maybe_free(c);
		return;
	}
	pthread_mutex_lock(&srv->mu);
	c->qnext = srv->done;
	srv->done = c;
	pthread_mutex_unlock(&srv->mu);
	uv_async_send(&srv->wake);
}

static void on_deadline(uv_timer_t *t)
{
	h2call *c = t->data;
	h2conn *cn = c->conn;

	if (cn != NULL && !c->answered) {
		reply(c, ST_DEADLINE_EXCEEDED, "Deadline Exceeded");
		conn_flush(cn);
	}
}

/* The n requests of a GetRateLimits or GetPeerRateLimits call, converted, with n answer
 * slots in c->resps (freed with c). Returns a new array (free() it), or NULL when n is over
 * RL_MAX_BATCH: c is then answered OUT_OF_RANGE as Gubernator does. */
static rl_req *take_requests(h2call *c, Pb__Gubernator__RateLimitReq *const *pb, size_t n)
{
	rl_req *reqs;
	size_t i;

	if (n > RL_MAX_BATCH) {
		char msg[120];
		snprintf(msg, sizeof(msg),
			 "Requests.RateLimits list too large; max size is '%d' (got %zu)",
			 RL_MAX_BATCH, n);
		reply(c, ST_OUT_OF_RANGE, msg);
		return NULL;
	}
	reqs = sdb_calloc(n ? n : 1, sizeof(*reqs));
	for (i = 0; i < n; i++)
		rl_proto_req_from_pb(pb[i], &reqs[i]);
	c->resps = sdb_calloc(n ? n : 1, sizeof(*c->resps));
	c->n = n;
	call_account(c);
	return reqs;
}

static void handle_get_rate_limits(h2call *c, const Pb__Gubernator__GetRateLimitsReq *m)
{
	rl_grpc_server *srv = c->srv;
	size_t n = m->n_requests;
	rl_req one, *reqs;
	char err[200];

	if (n == 1 && n <= RL_MAX_BATCH) { /* the common case, without an allocation */
		reqs = &one;
		memset(&one, 0, sizeof one);
		rl_proto_req_from_pb(m->requests[0], &one);
		c->resps = sdb_calloc(1, sizeof(*c->resps));
		c->n = 1;
		call_account(c);
	} else if ((reqs = take_requests(c, m->requests, n)) == NULL) {
		return;
	}
	if (rl_v1_reserved(reqs, n, err, sizeof err)) {
		reply(c, ST_PERMISSION_DENIED, err);
	} else {
		c->deciding = true;
		/* on_decided may complete c before this returns */
		if (rl_cluster_decide_async(srv->cluster, reqs, n, c->resps, on_decided, c, err,
					    sizeof(err)) != 0) {
			c->deciding = false;
			reply(c, ST_OUT_OF_RANGE, err);
		} else if (c->deciding && c->deadline_ns != 0) {
			uint64_t now = sdb_mono_ns();
			c->timer = sdb_malloc(sizeof(*c->timer));
			uv_timer_init(&srv->loop, c->timer);
			c->timer->data = c;
			uv_timer_start(c->timer, on_deadline,
				       c->deadline_ns > now ? (c->deadline_ns - now) / 1000000 + 1 : 0, 0);
		}
	}
	if (reqs != &one)
		free(reqs);
}

static void handle_get_peer(h2call *c, const Pb__Gubernator__GetPeerRateLimitsReq *m)
{
	size_t n = m->n_requests;
	rl_req *reqs = take_requests(c, m->requests, n);

	if (reqs == NULL)
		return;
	rl_cluster_peer_decide(c->srv->cluster, reqs, n, c->resps);
	free(reqs);
	reply_resps(c);
}

static void handle_update_globals(h2call *c, const Pb__Gubernator__UpdatePeerGlobalsReq *m)
{
	Pb__Gubernator__UpdatePeerGlobalsResp r = PB__GUBERNATOR__UPDATE_PEER_GLOBALS_RESP__INIT;

	rl_cluster_apply_globals(c->srv->cluster, m);
	set_out(c, &r.base);
	reply(c, ST_OK, NULL);
}

static void handle_health(h2call *c)
{
	Pb__Gubernator__HealthCheckResp r = PB__GUBERNATOR__HEALTH_CHECK_RESP__INIT;
	char msg[512];
	int peers = 0;
	bool ok = rl_cluster_health(c->srv->cluster, &peers, msg, sizeof(msg));

	r.status = (char *)(ok ? "healthy" : "unhealthy");
	r.message = msg;
	r.peer_count = peers;
	r.advertise_address = (char *)rl_cluster_advertise(c->srv->cluster);
	set_out(c, &r.base);
	reply(c, ST_OK, NULL);
}

static void handle_live(h2call *c)
{
	Pb__Gubernator__LiveCheckResp r = PB__GUBERNATOR__LIVE_CHECK_RESP__INIT;

	set_out(c, &r.base);
	reply(c, ST_OK, NULL);
}

/* The request has ended (END_STREAM): check it and dispatch on the method. Inside
 * nghttp2's receive, on the loop thread. */
static void dispatch(h2call *c)
{
	rl_grpc_server *srv = c->srv;
	const uint8_t *p = c->body;
	uint32_t len;
	int m = c->method;

	if (c->http_status != 200) {
		reply(c, ST_INTERNAL, c->http_status == 415 ? "content-type is not application/grpc"
							     : "gRPC requires POST");
		return;
	}
	if (m < 0) {
		reply(c, ST_UNIMPLEMENTED, "unknown method");
		return;
	}
	c->start_ns = sdb_mono_ns();
	sdb_counter_inc(srv->m_calls[m]);
	if (c->enc_bad) {
		reply(c, ST_UNIMPLEMENTED, "grpc-encoding not supported: only identity");
		return;
	}
	if (c->timeout_bad) { /* refused, not run without the deadline asked for (grpc-go) */
		reply(c, ST_INTERNAL, "malformed grpc-timeout");
		return;
	}
	if (c->hdr_too_large) {
		reply(c, ST_RESOURCE_EXHAUSTED, "request metadata larger than 16384 bytes");
		return;
	}
	if (c->too_large) {
		reply(c, ST_RESOURCE_EXHAUSTED, "request message larger than 4194304 bytes, or "
						 "over 32 MiB of requests pending on the connection");
		return;
	}
	if (c->blen == 0) {
		reply(c, ST_INVALID_ARGUMENT, "no request message");
		return;
	}
	if (c->blen < 5) {
		reply(c, ST_INTERNAL, "truncated gRPC message prefix");
		return;
	}
	len = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
	if (p[0] != 0) {
		reply(c, ST_INTERNAL, "compressed message without grpc-encoding");
		return;
	}
	if ((size_t)len != c->blen - 5) {
		reply(c, (size_t)len > c->blen - 5 ? ST_INTERNAL : ST_UNIMPLEMENTED,
		      (size_t)len > c->blen - 5 ? "truncated gRPC message"
						: "more than one request message in a unary call");
		return;
	}
	if (c->deadline_ns != 0 && sdb_mono_ns() >= c->deadline_ns) {
		reply(c, ST_DEADLINE_EXCEEDED, "Deadline Exceeded");
		return;
	}

	/* ---- issue #10: PeersV1 only from cluster members (auth/cluster.h) ---- */
	if ((m == M_GET_PEER || m == M_UPDATE_GLOBALS) && auth_cluster_peer_token() != NULL &&
	    !c->token_ok) {
		sdb_warn("audit", "event=denied what=\"PeersV1 without the cluster token\"%s", "");
		reply(c, ST_UNAUTHENTICATED, "PeersV1 needs the cluster token (--cluster-key-file)");
		return;
	}
	pthread_rwlock_rdlock(&srv->fence);
	if (srv->fenced) {
		reply(c, ST_UNAVAILABLE, "rate limiter shutting down");
	} else {
		const ProtobufCMessageDescriptor *d = requests[m];
		ProtobufCMessage *msg = NULL;

		if (d != NULL)
			msg = protobuf_c_message_unpack(d, NULL, len, p + 5);
		if (d != NULL && msg == NULL) {
			char e[120];
			snprintf(e, sizeof(e), "%s: malformed protobuf message", d->short_name);
			reply(c, ST_INVALID_ARGUMENT, e);
		} else {
			switch (m) {
			case M_GET_RATE_LIMITS:
				handle_get_rate_limits(c, (Pb__Gubernator__GetRateLimitsReq *)msg);
				break;
			case M_GET_PEER:
				handle_get_peer(c, (Pb__Gubernator__GetPeerRateLimitsReq *)msg);
				break;
			case M_UPDATE_GLOBALS:
				handle_update_globals(c, (Pb__Gubernator__UpdatePeerGlobalsReq *)msg);
				break;
			case M_HEALTH_CHECK:
				handle_health(c);
				break;
			default:
				handle_live(c);
				break;
			}
		}
		if (msg != NULL)
			protobuf_c_message_free_unpacked(msg, NULL);
	}
	pthread_rwlock_unlock(&srv->fence);
}

/* ---- nghttp2 callbacks (loop thread) ---- */

static int on_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	h2conn *cn = ud;
	h2call *c;

	if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	cn->active_ns = sdb_mono_ns();
	if (cn->buffered + cn->held > CONN_BUDGET) {
		/* over its budget (a client not reading its answers): refuse the stream, which
		 * a gRPC client retries transparently */
		nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, f->hd.stream_id,
					  NGHTTP2_REFUSED_STREAM);
		return 0;
	}
	c = sdb_calloc(1, sizeof(*c));
	c->srv = cn->srv;
	c->conn = cn;
	c->acct = cn;
	c->id = f->hd.stream_id;
	c->method = -1;
	c->http_status = 200;
	c->next = cn->calls;
	if (cn->calls)
		cn->calls->prev = c;
	cn->calls = c;
	nghttp2_session_set_stream_user_data(s, c->id, c);
	return 0;
}

/* grpc-timeout longer than this (ns, half of uint64) is no deadline: 8 digits of hours
 * (99999999H) would wrap x * mul, and mono + t near it would wrap too. */
#define GRPC_TIMEOUT_MAX (UINT64_MAX / 2)

/* Is v[0..n) a grpc-timeout as the gRPC HTTP/2 spec writes it: 1-8 digits and a unit? */
static bool timeout_well_formed(const uint8_t *v, size_t n)
{
	if (n < 2 || n > 9 || !strchr("HMSmun", v[n - 1]) || v[n - 1] == '\0')
		return false;
	for (size_t i = 0; i + 1 < n; i++)
		if (v[i] < '0' || v[i] > '9')
			return false;
	return true;
}

/* grpc-timeout: 1-8 digits and a unit (H M S m u n). 0 when malformed or over
 * GRPC_TIMEOUT_MAX (no deadline, as a wrapped value would be already past). */
static uint64_t parse_timeout(const uint8_t *v, size_t n)
{
	uint64_t x = 0, mul;
	size_t i;

	if (n < 2 || n > 9)
		return 0;
	for (i = 0; i + 1 < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return 0;
		x = x * 10 + (uint64_t)(v[i] - '0');
	}
	switch (v[n - 1]) {
	case 'H': mul = 3600000000000ull; break;
	case 'M': mul = 60000000000ull; break;
	case 'S': mul = 1000000000ull; break;
	case 'm': mul = 1000000ull; break;
	case 'u': mul = 1000ull; break;
	case 'n': mul = 1ull; break;
	default: return 0;
	}
	if (x > (GRPC_TIMEOUT_MAX - 1) / mul)
		return 0; /* beyond ~292 years (uint64 ns would wrap): no deadline */
	return x * mul + 1; /* +1: "0n" still sets a deadline, already past */
}

#define HDR_IS(name, lit) (name##len == sizeof(lit) - 1 && memcmp(name, lit, sizeof(lit) - 1) == 0)

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
		     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
		     void *ud)
{
	h2call *c;

	(void)flags;
	(void)ud;
	if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0; /* trailers of a request: nothing we read */
	c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
	if (c == NULL || c->hdr_too_large)
		return 0;
	c->hdr_size += namelen + valuelen + 32;
	if (c->hdr_size > MAX_HEADER_LIST) { /* answered RESOURCE_EXHAUSTED at its end */
		c->hdr_too_large = true;
		return 0;
	}
	if (HDR_IS(name, ":path")) {
		for (int m = 0; m < M__COUNT; m++)
			if (strlen(methods[m]) == valuelen && memcmp(methods[m], value, valuelen) == 0)
				c->method = m;
	} else if (HDR_IS(name, ":method")) {
		if (!(valuelen == 4 && memcmp(value, "POST", 4) == 0))
			c->http_status = 405;
	} else if (HDR_IS(name, "content-type")) {
		if (valuelen < 16 || memcmp(value, "application/grpc", 16) != 0 ||
		    (valuelen > 16 && value[16] != '+' && value[16] != ';'))
			if (c->http_status == 200)
				c->http_status = 415;
	} else if (HDR_IS(name, "grpc-timeout")) {
		uint64_t t = parse_timeout(value, valuelen);
		uint64_t now = sdb_mono_ns();
		if (!timeout_well_formed(value, valuelen))
			c->timeout_bad = true;
		if (t != 0 && t <= UINT64_MAX - now) /* else: no deadline, not a wrapped one */
			c->deadline_ns = now + t;
	} else if (HDR_IS(name, "grpc-encoding")) {
		if (!(valuelen == 8 && memcmp(value, "identity", 8) == 0))
			c->enc_bad = true;
	} else if (HDR_IS(name, AUTH_CLUSTER_PEER_HEADER)) {
		if (auth_cluster_peer_token() != NULL)
			c->token_ok = auth_cluster_peer_token_ok((const char *)value, valuelen);
	}
	return 0;
}

static int on_data_chunk(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
			 size_t len, void *ud)
{
	h2call *c = nghttp2_session_get_stream_user_data(s, id);

	(void)flags;
	(void)ud;
	if (c == NULL || c->too_large)
		return 0;
	if (c->blen + len > MAX_MESSAGE + 5 || c->conn->buffered + len > CONN_BUFFERED) {
		c->too_large = true; /* the rest of the stream is read and dropped */
		c->conn->buffered -= c->blen;
		free(c->body);
		c->body = NULL;
		c->blen = c->bcap = 0;
		return 0;
	}
	c->conn->buffered += len;
	if (c->blen + len > c->bcap) {
		size_t cap = c->bcap ? c->bcap * 2 : 256;
		while (cap < c->blen + len)
			cap *= 2;
		c->body = sdb_realloc(c->body, cap);
		c->bcap = cap;
	}
	memcpy(c->body + c->blen, data, len);
	c->blen += len;
	return 0;
}

static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	h2conn *cn = ud;
	h2call *c;

	if (f->hd.type == NGHTTP2_SETTINGS && !(f->hd.flags & NGHTTP2_FLAG_ACK))
		cn->ready = true; /* nghttp2 checked the preface before it */
	if ((f->hd.type != NGHTTP2_DATA && f->hd.type != NGHTTP2_HEADERS) ||
	    !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
		return 0;
	c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
	if (c != NULL && !c->answered && !c->deciding) {
		dispatch(c);
		if (c->conn != NULL) /* the body is unpacked: release it */
			c->conn->buffered -= c->blen;
		free(c->body);
		c->body = NULL;
		c->blen = c->bcap = 0;
	}
	return 0;
}

static int on_stream_close(nghttp2_session *s, int32_t id, uint32_t code, void *ud)
{
	h2call *c = nghttp2_session_get_stream_user_data(s, id);
	h2conn *cn = ud;

	(void)code;
	cn->active_ns = sdb_mono_ns();
	if (c == NULL)
		return 0;
	nghttp2_session_set_stream_user_data(s, id, NULL);
	call_unlink(c); /* a deciding call stays counted against cn, as an orphan */
	call_maybe_free(c);
	return 0;
}

/* ---- connections ---- */

static void conn_closed(uv_handle_t *h)
{
	h2conn *cn = h->data;

	free(cn->obuf);
	free(cn);
}

/* Close cn (why: for the debug log): its calls are orphaned or freed, its session and TLS
 * freed at once, the struct itself when libuv has closed the socket. Idempotent. */
static void conn_close(h2conn *cn, const char *why)
{
	rl_grpc_server *srv = cn->srv;

	if (cn->closing)
		return;
	cn->closing = true;
	sdb_debug("grpc: closing a connection", "why=\"%s\"", why);
	while (cn->calls) {
		h2call *c = cn->calls;
		call_unlink(c);
		call_maybe_free(c);
	}
	while (cn->orphans) /* they outlive cn: counted nowhere now */
		call_unaccount(cn->orphans);
	nghttp2_session_del(cn->sess); /* calls no stream-close callback */
	cn->sess = NULL;
	tls_conn_free(cn->tls);
	cn->tls = NULL;
	if (cn->prev)
		cn->prev->next = cn->next;
	else
		srv->conns = cn->next;
	if (cn->next)
		cn->next->prev = cn->prev;
	srv->n_conns--;
	uv_close((uv_handle_t *)&cn->tcp, conn_closed);
}

static void obuf_append(void *arg, const uint8_t *d, size_t n)
{
	h2conn *cn = arg;

	if (cn->olen + n > cn->ocap) {
		size_t cap = cn->ocap ? cn->ocap : 16384;
		while (cap < cn->olen + n)
			cap *= 2;
		cn->obuf = sdb_realloc(cn->obuf, cap);
		cn->ocap = cap;
	}
	memcpy(cn->obuf + cn->olen, d, n);
	cn->olen += n;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);

static void on_written(uv_write_t *w, int status)
{
	h2conn *cn = w->handle->data;

	free(w);
	if (cn->closing)
		return;
	if (status < 0) {
		conn_close(cn, "write failed");
		return;
	}
	if (cn->paused && cn->tcp.write_queue_size < WRITE_LOW) {
		cn->paused = false;
		uv_read_start((uv_stream_t *)&cn->tcp, on_alloc, on_read);
	}
	if (cn->tcp.write_queue_size == 0 && !nghttp2_session_want_read(cn->sess) &&
	    !nghttp2_session_want_write(cn->sess))
		conn_close(cn, "session over");
}

/* Send what nghttp2 has to send (through TLS when on), then write it to the socket. */
static void conn_flush(h2conn *cn)
{
	if (cn->closing)
		return;
	if (cn->tls == NULL || tls_conn_ready(cn->tls)) {
		for (;;) {
			const uint8_t *d;
			ssize_t n = nghttp2_session_mem_send(cn->sess, &d);
			if (n < 0) {
				conn_close(cn, "nghttp2 send failed");
				return;
			}
			if (n == 0)
				break;
			if (cn->tls == NULL)
				obuf_append(cn, d, (size_t)n);
			else if (tls_conn_write(cn->tls, d, (size_t)n, obuf_append, cn) != 0) {
				conn_close(cn, "TLS write failed");
				return;
			}
		}
	}
	if (cn->olen > 0) {
		uv_buf_t b = uv_buf_init((char *)cn->obuf, (unsigned)cn->olen);
		int w = uv_try_write((uv_stream_t *)&cn->tcp, &b, 1);
		if (w < 0 && w != UV_EAGAIN) {
			conn_close(cn, "write failed");
			return;
		}
		if (w < 0)
			w = 0;
		if ((size_t)w < cn->olen) {
			size_t rest = cn->olen - (size_t)w;
			uv_write_t *req = sdb_malloc(sizeof(*req) + rest);
			uint8_t *copy = (uint8_t *)(req + 1);
			memcpy(copy, cn->obuf + w, rest);
			b = uv_buf_init((char *)copy, (unsigned)rest);
			if (uv_write(req, (uv_stream_t *)&cn->tcp, &b, 1, on_written) != 0) {
				free(req);
				cn->olen = 0;
				conn_close(cn, "write failed");
				return;
			}
			if (cn->tcp.write_queue_size > WRITE_HIGH && !cn->paused) {
				cn->paused = true;
				uv_read_stop((uv_stream_t *)&cn->tcp);
			}
		}
		cn->olen = 0;
		if (cn->ocap > 256 * 1024) { /* a large answer went out: do not keep its buffer */
			free(cn->obuf);
			cn->obuf = NULL;
			cn->ocap = 0;
		}
	}
	if (cn->tcp.write_queue_size == 0 && !nghttp2_session_want_read(cn->sess) &&
	    !nghttp2_session_want_write(cn->sess))
		conn_close(cn, "session over");
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	h2conn *cn = h->data;

	(void)hint;
	*buf = uv_buf_init((char *)cn->srv->rbuf, sizeof cn->srv->rbuf);
}

static void tls_plain(void *arg, const uint8_t *d, size_t n)
{
	h2conn *cn = arg;

	if (cn->failed)
		return;
	ssize_t rv = nghttp2_session_mem_recv(cn->sess, d, n);

	if (rv < 0) {
		sdb_debug("grpc: not HTTP/2, closing", "err=\"%s\"", nghttp2_strerror((int)rv));
		cn->failed = true;
	}
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	h2conn *cn = st->data;

	if (nread == 0)
		return;
	if (nread < 0) {
		if (nread != UV_EOF)
			sdb_debug("grpc: connection error", "err=%s", uv_strerror((int)nread));
		conn_close(cn, "read: end or error");
		return;
	}
	if (cn->tls != NULL) {
		if (tls_conn_feed(cn->tls, (const uint8_t *)buf->base, (size_t)nread, tls_plain,
				  obuf_append, cn) != 0)
			cn->failed = true;
	} else {
		tls_plain(cn, (const uint8_t *)buf->base, (size_t)nread);
	}
	if (cn->failed) { /* garbage: send nghttp2's GOAWAY when we can, then close */
		conn_flush(cn);
		conn_close(cn, "not HTTP/2 (or TLS failed)");
		return;
	}
	conn_flush(cn);
}

static void on_connection(uv_stream_t *ls, int status)
{
	rl_grpc_server *srv = ls->data;
	nghttp2_settings_entry iv[3] = {
		{NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST},
		{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS},
		{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
	};
	h2conn *cn;

	if (status < 0)
		return;
	cn = sdb_calloc(1, sizeof(*cn));
	cn->srv = srv;
	uv_tcp_init(&srv->loop, &cn->tcp);
	cn->tcp.data = cn;
	if (uv_accept(ls, (uv_stream_t *)&cn->tcp) != 0) {
		uv_close((uv_handle_t *)&cn->tcp, conn_closed);
		return;
	}
	if (srv->n_conns >= srv->max_conns || srv->listener_closed) {
		/* over the cap: closed at once, so the process keeps fds for /healthz and the
		 * HTTP gateway */
		sdb_debug("grpc: too many connections, closing a new one", "max=%zu",
			  srv->max_conns);
		uv_close((uv_handle_t *)&cn->tcp, conn_closed);
		return;
	}
	uv_tcp_nodelay(&cn->tcp, 1);
	if (srv->tls != NULL && (cn->tls = tls_conn_new(srv->tls)) == NULL) {
		uv_close((uv_handle_t *)&cn->tcp, conn_closed);
		return;
	}
	if (nghttp2_session_server_new2(&cn->sess, srv->cbs, cn, srv->h2opt) != 0) {
		tls_conn_free(cn->tls);
		uv_close((uv_handle_t *)&cn->tcp, conn_closed);
		return;
	}
	nghttp2_submit_settings(cn->sess, NGHTTP2_FLAG_NONE, iv, 3);
	nghttp2_session_set_local_window_size(cn->sess, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW);
	cn->next = srv->conns;
	if (srv->conns)
		srv->conns->prev = cn;
	srv->conns = cn;
	srv->n_conns++;
	cn->accepted_ns = cn->active_ns = sdb_mono_ns();
	uv_read_start((uv_stream_t *)&cn->tcp, on_alloc, on_read);
	conn_flush(cn);
}

/* ---- the loop thread ---- */

/* Every quarter of the shorter timeout: close the connections that have not finished their
 * handshake (TLS, preface, SETTINGS) in time, and send GOAWAY to and close those without an
 * open stream for longer than the idle time (gRPC's max_connection_idle). */
static void on_sweep(uv_timer_t *t)
{
	rl_grpc_server *srv = t->data;
	uint64_t now = sdb_mono_ns();

	for (h2conn *cn = srv->conns, *nx; cn; cn = nx) {
		nx = cn->next;
		if (!cn->ready) {
			if (now - cn->accepted_ns >= srv->handshake_ns)
				conn_close(cn, "no HTTP/2 preface and SETTINGS in time");
		} else if (cn->calls == NULL && now - cn->active_ns >= srv->idle_ns) {
			if (nghttp2_submit_goaway(cn->sess, NGHTTP2_FLAG_NONE,
						  nghttp2_session_get_last_proc_stream_id(cn->sess),
						  NGHTTP2_NO_ERROR, (const uint8_t *)"max_idle",
						  8) == 0)
				conn_flush(cn); /* may close cn */
			conn_close(cn, "idle");
		}
	}
}

static void close_any(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (!uv_is_closing(h))
		uv_close(h, h->type == UV_TIMER ? timer_free : NULL);
}

static void on_wake(uv_async_t *a)
{
	rl_grpc_server *srv = a->data;
	h2call *done, *next;
	bool stop, exit_;

	pthread_mutex_lock(&srv->mu);
	done = srv->done;
	srv->done = NULL;
	stop = srv->stop_req;
	exit_ = srv->exit_req;
	pthread_mutex_unlock(&srv->mu);
	for (h2call *rev = NULL;; done = next) { /* oldest first */
		if (done == NULL) {
			done = rev;
			break;
		}
		next = done->qnext;
		done->qnext = rev;
		rev = done;
	}
	for (; done; done = next) {
		next = done->qnext;
		call_decided(done);
	}
	if ((stop || exit_) && !srv->listener_closed) {
		srv->listener_closed = true;
		uv_close((uv_handle_t *)&srv->listener, NULL);
		/* gRPC core's graceful shutdown: a first GOAWAY (last stream 2^31-1) so that
		 * clients open no new stream here, then the final one below */
		for (h2conn *cn = srv->conns, *nx; cn; cn = nx) {
			nx = cn->next;
			if (nghttp2_submit_shutdown_notice(cn->sess) == 0)
				conn_flush(cn); /* may close cn */
		}
	}
	if (exit_ && !uv_is_closing((uv_handle_t *)&srv->sweep))
		uv_close((uv_handle_t *)&srv->sweep, NULL);
	if (exit_) {
		/* the final GOAWAY names the last stream processed: the client retries the
		 * later ones elsewhere, transparently */
		for (h2conn *cn = srv->conns, *nx; cn; cn = nx) {
			nx = cn->next;
			if (nghttp2_submit_goaway(cn->sess, NGHTTP2_FLAG_NONE,
						  nghttp2_session_get_last_proc_stream_id(cn->sess),
						  NGHTTP2_NO_ERROR, NULL, 0) == 0)
				conn_flush(cn);
		}
		while (srv->conns)
			conn_close(srv->conns, "server stopping");
		uv_walk(&srv->loop, close_any, NULL); /* the wake handle and deadline timers */
	}
}

static void *loop_main(void *arg)
{
	rl_grpc_server *srv = arg;

	sdb_log_set_thread_role("ratelimit-grpc"); /* the node id: from its starter */
	uv_run(&srv->loop, UV_RUN_DEFAULT);
	return NULL;
}

bool rl_v1_reserved(const rl_req *reqs, size_t n, char *msg, size_t msglen)
{
	for (size_t i = 0; i < n; i++)
		if (auth_cluster_reserved_name(reqs[i].name, msg, msglen))
			return true;
	return false;
}

void rl_grpc_tune_runtime(void)
{
	/* absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore): kIgnore is 0 */
	static const char *const names[] = {
		"_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
		"_ZN4absl12lts_2022062329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		void *sym = dlsym(RTLD_DEFAULT, names[i]);
		if (sym != NULL) {
			void (*set_mode)(int);
			memcpy(&set_mode, &sym, sizeof set_mode);
			set_mode(0);
			return;
		}
	}
}

/* Bind srv->listener to "HOST:PORT" ("[v6]:PORT"; an empty host: every interface). */
static int bind_listener(rl_grpc_server *srv, const char *listen, char *err, size_t errlen)
{
	const char *colon = strrchr(listen, ':');
	char host[256], port[16];
	struct addrinfo hints, *res = NULL, *ai;
	struct sockaddr_storage ss;
	int namelen = sizeof ss, rv = -1;
	size_t hl;

	if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) >= sizeof port)
		return sdb_errf(err, errlen, SDB_EIO, "grpc: cannot listen on %s (HOST:PORT)",
				listen);
	hl = (size_t)(colon - listen);
	if (hl >= 2 && listen[0] == '[' && listen[hl - 1] == ']') {
		listen++;
		hl -= 2;
	}
	if (hl >= sizeof host)
		return sdb_errf(err, errlen, SDB_EIO, "grpc: cannot listen on %s", listen);
	memcpy(host, listen, hl);
	host[hl] = '\0';
	snprintf(port, sizeof port, "%s", colon + 1);
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	if (getaddrinfo(hl ? host : NULL, port, &hints, &res) != 0)
		return sdb_errf(err, errlen, SDB_EIO, "grpc: cannot listen on %s: bad address",
				colon - hl);
	for (ai = res; ai; ai = ai->ai_next) {
		uv_tcp_init(&srv->loop, &srv->listener);
		rv = uv_tcp_bind(&srv->listener, ai->ai_addr, 0);
		if (rv == 0)
			rv = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection);
		if (rv == 0)
			break;
		uv_close((uv_handle_t *)&srv->listener, NULL);
		uv_run(&srv->loop, UV_RUN_NOWAIT);
	}
	freeaddrinfo(res);
	if (rv != 0)
		return sdb_errf(err, errlen, SDB_EIO, "grpc: cannot listen on %s: %s", colon - hl,
				uv_strerror(rv));
	srv->listener.data = srv;
	uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &namelen);
	srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						   : ((struct sockaddr_in *)&ss)->sin_port);
	return 0;
}

static void server_release(rl_grpc_server *srv)
{
	if (srv->cbs)
		nghttp2_session_callbacks_del(srv->cbs);
	if (srv->h2opt)
		nghttp2_option_del(srv->h2opt);
	pthread_mutex_destroy(&srv->mu);
	pthread_rwlock_destroy(&srv->fence);
	free(srv);
}

int rl_grpc_server_new(const rl_grpc_server_opts *opts, rl_grpc_server **out, char *err,
		       size_t errlen)
{
	rl_grpc_server *srv;
	int i, rv;

	*out = NULL;
	if (opts->listen == NULL || opts->listen[0] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL, "grpc: no listen address");
	srv = sdb_calloc(1, sizeof(*srv));
	srv->cluster = opts->cluster;
	srv->handshake_ns = (uint64_t)(opts->handshake_ms > 0 ? opts->handshake_ms : HANDSHAKE_MS) *
			    1000000;
	srv->idle_ns = (uint64_t)(opts->max_idle_ms > 0 ? opts->max_idle_ms : MAX_IDLE_MS) * 1000000;
	srv->max_conns = (size_t)(opts->max_conns > 0 ? opts->max_conns : MAX_CONNS);
	pthread_rwlock_init(&srv->fence, NULL);
	pthread_mutex_init(&srv->mu, NULL);
	if (tls_listener_mode(RL_GRPC_TLS_ROLE) != TLS_MODE_DISABLED) {
		char *cert, *key, *ca;
		unsigned gen = 0;
		/* read once now so that bad files fail the start with a clear message */
		if (tls_listener_pem(RL_GRPC_TLS_ROLE, &gen, &cert, &key, &ca, err, errlen) < 0) {
			server_release(srv);
			return SDB_EINVAL;
		}
		free(cert);
		memset(key, 0, strlen(key));
		free(key);
		sdb_info("grpc: TLS on the listener", "client_cert=%s", ca ? "required" : "no");
		free(ca);
		srv->tls = tls_listener_get(RL_GRPC_TLS_ROLE);
		tls_listener_set_alpn_h2(srv->tls);
	}
	nghttp2_session_callbacks_new(&srv->cbs);
	nghttp2_session_callbacks_set_on_begin_headers_callback(srv->cbs, on_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(srv->cbs, on_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(srv->cbs, on_data_chunk);
	nghttp2_session_callbacks_set_on_frame_recv_callback(srv->cbs, on_frame_recv);
	nghttp2_session_callbacks_set_on_stream_close_callback(srv->cbs, on_stream_close);
	nghttp2_option_new(&srv->h2opt);
#ifdef HAVE_NGHTTP2_OPTION_SET_STREAM_RESET_RATE_LIMIT
	nghttp2_option_set_stream_reset_rate_limit(srv->h2opt, RESET_BURST, RESET_RATE);
#endif
#ifdef HAVE_NGHTTP2_OPTION_SET_MAX_CONTINUATIONS
	nghttp2_option_set_max_continuations(srv->h2opt, MAX_CONTINUATIONS);
#endif
	for (i = 0; i < M__COUNT; i++) {
		srv->m_calls[i] = sdb_metrics_counter("stripedb_ratelimit_grpc_calls_total",
						      "gRPC calls received by method", method_labels[i]);
		srv->m_latency[i] = sdb_metrics_histogram("stripedb_ratelimit_grpc_call_seconds",
							  "gRPC call latency by method",
							  method_labels[i]);
	}
	SDB_METRICS_REGISTER(srv, grpc_server_metrics, NULL);
	uv_loop_init(&srv->loop);
	rv = bind_listener(srv, opts->listen, err, errlen);
	if (rv == 0) {
		uint64_t every;
		uv_async_init(&srv->loop, &srv->wake, on_wake);
		srv->wake.data = srv;
		uv_timer_init(&srv->loop, &srv->sweep);
		srv->sweep.data = srv;
		every = (srv->handshake_ns < srv->idle_ns ? srv->handshake_ns : srv->idle_ns) /
			4000000;
		every = every < 50 ? 50 : every > 1000 ? 1000 : every;
		uv_timer_start(&srv->sweep, on_sweep, every, every);
		rv = sdb_thread_create(&srv->thread, loop_main, srv);
		if (rv != 0) {
			rv = sdb_errf(err, errlen, SDB_EIO, "grpc: thread: %s", strerror(rv));
			uv_close((uv_handle_t *)&srv->wake, NULL);
			uv_close((uv_handle_t *)&srv->sweep, NULL);
			uv_close((uv_handle_t *)&srv->listener, NULL);
		}
	}
	if (rv != 0) {
		uv_run(&srv->loop, UV_RUN_DEFAULT); /* the closes */
		uv_loop_close(&srv->loop);
		server_release(srv);
		return rv;
	}
	srv->started = true;
	*out = srv;
	return 0;
}

int rl_grpc_server_port(const rl_grpc_server *srv)
{
	return srv->port;
}

void rl_grpc_server_shutdown(rl_grpc_server *srv)
{
	if (srv->shut)
		return;
	srv->shut = true;
	pthread_rwlock_wrlock(&srv->fence);
	srv->fenced = true;
	pthread_rwlock_unlock(&srv->fence);
	pthread_mutex_lock(&srv->mu);
	srv->stop_req = true;
	pthread_mutex_unlock(&srv->mu);
	uv_async_send(&srv->wake);
}

void rl_grpc_server_free(rl_grpc_server *srv)
{
	if (srv == NULL)
		return;
	rl_grpc_server_shutdown(srv);
	pthread_mutex_lock(&srv->mu);
	srv->exit_req = true;
	pthread_mutex_unlock(&srv->mu);
	uv_async_send(&srv->wake);
	pthread_join(srv->thread, NULL);
	if (srv->done != NULL) /* decided after the loop ended: not reached when the cluster
				* was freed first, as the protocol above asks */
		sdb_warn("grpc: decisions completed after the server stopped", NULL);
	uv_loop_close(&srv->loop);
	server_release(srv);
}
