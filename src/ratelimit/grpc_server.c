/* gRPC C core server for pb.gubernator.V1 and PeersV1 (see grpc_server.h). */
#include "ratelimit/grpc_server.h"
#include "ratelimit/membership.h"

#include <bson/bson.h>
#include <dlfcn.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
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
#include "common/metrics.h"
#include "ratelimit/proto.h"
#include "tls/tls.h"

/* calls requested ahead from gRPC, per method */
static const int outstanding[] = {64, 4, 4, 32, 8};
#define OUTSTANDING_UNKNOWN 2
#define MAX_THREADS 16

/* Call lifecycle: REQUESTED (waiting for a client; our methods are registered with
 * GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, so the request message arrives with the call)
 * -> DECIDING (the cluster answers, maybe later) -> SENDING (reply + status) -> freed.
 * A call to an unknown method arrives unregistered and goes REQUESTED -> SENDING
 * (UNIMPLEMENTED); so do calls answered at once (errors, peer calls, health). */
typedef enum { SC_REQUESTED, SC_DECIDING, SC_SENDING } sc_state;

typedef struct srv_call {
	rl_grpc_server *srv;
	sc_state state;
	grpc_call *call;
	grpc_call_details details;
	grpc_metadata_array req_md;
	grpc_byte_buffer *recv;
	grpc_byte_buffer *send;
	int cancelled;
	grpc_slice status_details;
	gpr_timespec deadline;
	uint64_t start_ns;
	int method; /* index into methods[], -1 for an unregistered (unknown) method */
	rl_resp *resps;
	size_t n;
} srv_call;

#ifdef SDB_DEBUG
static const bool sc_transitions[3][3] = {
	/* to:             REQUESTED DECIDING SENDING */
	[SC_REQUESTED] = {false, true, true},
	[SC_DECIDING] = {false, false, true},
	[SC_SENDING] = {false, false, false},
};
#endif

static void sc_set_state(srv_call *c, sc_state to)
{
#ifdef SDB_DEBUG
	if (!sc_transitions[c->state][to]) {
		sdb_error("grpc: illegal call state transition", "from=%d to=%d", (int)c->state,
			  (int)to);
		abort();
	}
#endif
	c->state = to;
}

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

struct rl_grpc_server {
	grpc_server *server;
	pthread_mutex_t tls_mu; /* guards tls_gen (the certificate fetcher runs on any thread) */
	unsigned tls_gen;       /* generation of the certificates gRPC serves (tls/tls.h) */
	grpc_completion_queue *cq;
	int port;
	int n_threads;
	pthread_t threads[MAX_THREADS];
	rl_cluster *cluster;
	pthread_rwlock_t fence; /* read: a handler uses cluster; write: shutdown fences it */
	bool fenced;
	bool shut;
	int shutdown_tag; /* its address is the server shutdown tag */
	void *registered[M__COUNT];
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool shutdown_done;
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

/* Ask gRPC for the next call of method m (-1: of any unregistered method). */
static void post_request(rl_grpc_server *srv, int m)
{
	srv_call *c = sdb_calloc(1, sizeof(*c));
	grpc_call_error ce;

	c->srv = srv;
	c->state = SC_REQUESTED;
	c->method = m;
	c->status_details = grpc_empty_slice();
	grpc_call_details_init(&c->details);
	grpc_metadata_array_init(&c->req_md);
	if (m >= 0)
		ce = grpc_server_request_registered_call(srv->server, srv->registered[m], &c->call,
							 &c->deadline, &c->req_md, &c->recv,
							 srv->cq, srv->cq, c);
	else
		ce = grpc_server_request_call(srv->server, &c->call, &c->details, &c->req_md,
					      srv->cq, srv->cq, c);
	if (ce != GRPC_CALL_OK) {
		grpc_call_details_destroy(&c->details);
		grpc_metadata_array_destroy(&c->req_md);
		free(c);
	}
}

static void call_free(srv_call *c)
{
	if (c->call)
		grpc_call_unref(c->call);
	grpc_call_details_destroy(&c->details);
	grpc_metadata_array_destroy(&c->req_md);
	if (c->recv)
		grpc_byte_buffer_destroy(c->recv);
	if (c->send)
		grpc_byte_buffer_destroy(c->send);
	grpc_slice_unref(c->status_details);
	free(c->resps);
	free(c);
}

/* Finish c with status (and msg bytes, taken over, when code is OK). Any thread. */
static void reply(srv_call *c, grpc_status_code code, uint8_t *msg, size_t len,
		  const char *details)
{
	grpc_op ops[4];
	size_t n = 0;

	sc_set_state(c, SC_SENDING);
	memset(ops, 0, sizeof(ops));
	ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[n].data.send_initial_metadata.count = 0;
	n++;
	if (code == GRPC_STATUS_OK && msg != NULL) {
		grpc_slice s = grpc_slice_from_copied_buffer((const char *)msg, len);
		c->send = grpc_raw_byte_buffer_create(&s, 1);
		grpc_slice_unref(s);
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n].data.send_message.send_message = c->send;
		n++;
	}
	free(msg);
	grpc_slice_unref(c->status_details);
	c->status_details = grpc_slice_from_copied_string(details ? details : "");
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.trailing_metadata_count = 0;
	ops[n].data.send_status_from_server.status = code;
	ops[n].data.send_status_from_server.status_details = &c->status_details;
	n++;
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
	n++;
	if (code != GRPC_STATUS_OK && c->method >= 0)
		sdb_counter_inc(c->srv->m_bad);
	if (grpc_call_start_batch(c->call, ops, n, c, NULL) != GRPC_CALL_OK) {
		sdb_warn("grpc: could not send a reply", "method=%s",
			 c->method >= 0 ? methods[c->method] : "?");
		call_free(c);
	}
}

/* Serialise the GetRateLimits or GetPeerRateLimits answer held in c->resps. */
static void reply_resps(srv_call *c)
{
	rl_pb_resp *slots = sdb_calloc(c->n ? c->n : 1, sizeof(*slots));
	Pb__Gubernator__RateLimitResp **ptrs = sdb_calloc(c->n ? c->n : 1, sizeof(*ptrs));
	uint8_t *buf;
	size_t len, i;

	for (i = 0; i < c->n; i++) {
		rl_proto_resp_to_pb(&c->resps[i], &slots[i]);
		ptrs[i] = &slots[i].msg;
	}
	if (c->method == M_GET_RATE_LIMITS) {
		Pb__Gubernator__GetRateLimitsResp m = PB__GUBERNATOR__GET_RATE_LIMITS_RESP__INIT;
		m.n_responses = c->n;
		m.responses = ptrs;
		buf = rl_proto_pack(&m.base, &len);
	} else {
		Pb__Gubernator__GetPeerRateLimitsResp m =
			PB__GUBERNATOR__GET_PEER_RATE_LIMITS_RESP__INIT;
		m.n_rate_limits = c->n;
		m.rate_limits = ptrs;
		buf = rl_proto_pack(&m.base, &len);
	}
	free(ptrs);
	free(slots);
	sdb_counter_add(c->srv->m_decisions, c->n);
	reply(c, GRPC_STATUS_OK, buf, len, NULL);
}

static void on_decided(void *arg)
{
	reply_resps(arg);
}

/* Finish c with INVALID_ARGUMENT: its request message (named what) did not unpack. */
static void reply_malformed(srv_call *c, const char *what)
{
	char msg[120];

	snprintf(msg, sizeof(msg), "%s: malformed protobuf message", what);
	reply(c, GRPC_STATUS_INVALID_ARGUMENT, NULL, 0, msg);
}

static void too_many(srv_call *c, size_t n)
{
	char msg[120];

	snprintf(msg, sizeof(msg), "Requests.RateLimits list too large; max size is '%d' (got %zu)",
		 RL_MAX_BATCH, n);
	reply(c, GRPC_STATUS_OUT_OF_RANGE, NULL, 0, msg);
}

/* The n requests of a GetRateLimits or GetPeerRateLimits call, converted, with n answer
 * slots in c->resps (freed with c). Returns a new array (free() it), or NULL when n is over
 * RL_MAX_BATCH: c is then answered OUT_OF_RANGE as Gubernator does. */
static rl_req *take_requests(srv_call *c, Pb__Gubernator__RateLimitReq *const *pb, size_t n)
{
	rl_req *reqs;
	size_t i;

	if (n > RL_MAX_BATCH) {
		too_many(c, n);
		return NULL;
	}
	reqs = sdb_calloc(n ? n : 1, sizeof(*reqs));
	for (i = 0; i < n; i++)
		rl_proto_req_from_pb(pb[i], &reqs[i]);
	c->resps = sdb_calloc(n ? n : 1, sizeof(*c->resps));
	c->n = n;
	return reqs;
}

static void handle_get_rate_limits(srv_call *c, const Pb__Gubernator__GetRateLimitsReq *m)
{
	rl_grpc_server *srv = c->srv;
	size_t n = m->n_requests;
	rl_req *reqs = take_requests(c, m->requests, n);
	char err[200];

	if (reqs == NULL)
		return;
	if (rl_v1_reserved(reqs, n, err, sizeof err)) {
		reply(c, GRPC_STATUS_PERMISSION_DENIED, NULL, 0, err);
		free(reqs);
		return;
	}
	sc_set_state(c, SC_DECIDING);
	/* on_decided may complete and free c before this returns: do not touch c after */
	if (rl_cluster_decide_async(srv->cluster, reqs, n, c->resps, on_decided, c, err,
				    sizeof(err)) != 0)
		reply(c, GRPC_STATUS_OUT_OF_RANGE, NULL, 0, err);
	free(reqs);
}

static void handle_get_peer(srv_call *c, const Pb__Gubernator__GetPeerRateLimitsReq *m)
{
	size_t n = m->n_requests;
	rl_req *reqs = take_requests(c, m->requests, n);

	if (reqs == NULL)
		return;
	rl_cluster_peer_decide(c->srv->cluster, reqs, n, c->resps);
	free(reqs);
	reply_resps(c);
}

static void handle_update_globals(srv_call *c, const Pb__Gubernator__UpdatePeerGlobalsReq *m)
{
	Pb__Gubernator__UpdatePeerGlobalsResp r = PB__GUBERNATOR__UPDATE_PEER_GLOBALS_RESP__INIT;
	uint8_t *buf;
	size_t blen;

	rl_cluster_apply_globals(c->srv->cluster, m);
	buf = rl_proto_pack(&r.base, &blen);
	reply(c, GRPC_STATUS_OK, buf, blen, NULL);
}

static void handle_health(srv_call *c)
{
	Pb__Gubernator__HealthCheckResp r = PB__GUBERNATOR__HEALTH_CHECK_RESP__INIT;
	char msg[512];
	int peers = 0;
	uint8_t *buf;
	size_t len;
	bool ok = rl_cluster_health(c->srv->cluster, &peers, msg, sizeof(msg));

	r.status = (char *)(ok ? "healthy" : "unhealthy");
	r.message = msg;
	r.peer_count = peers;
	r.advertise_address = (char *)rl_cluster_advertise(c->srv->cluster);
	buf = rl_proto_pack(&r.base, &len);
	reply(c, GRPC_STATUS_OK, buf, len, NULL);
}

static void handle_live(srv_call *c)
{
	Pb__Gubernator__LiveCheckResp r = PB__GUBERNATOR__LIVE_CHECK_RESP__INIT;
	uint8_t *buf;
	size_t len;

	buf = rl_proto_pack(&r.base, &len);
	reply(c, GRPC_STATUS_OK, buf, len, NULL);
}

/* The request message has arrived (or not): dispatch on the method. */
static void dispatch(srv_call *c)
{
	rl_grpc_server *srv = c->srv;
	grpc_slice flat;
	grpc_byte_buffer_reader rd;
	int m;

	m = c->method;
	if (m < 0) {
		reply(c, GRPC_STATUS_UNIMPLEMENTED, NULL, 0, "unknown method");
		return;
	}
	sdb_counter_inc(srv->m_calls[m]);
	if (c->recv == NULL) {
		reply(c, GRPC_STATUS_INVALID_ARGUMENT, NULL, 0, "no request message");
		return;
	}
	if (!grpc_byte_buffer_reader_init(&rd, c->recv)) {
		reply(c, GRPC_STATUS_INVALID_ARGUMENT, NULL, 0, "unreadable request message");
		return;
	}
	flat = grpc_byte_buffer_reader_readall(&rd);
	grpc_byte_buffer_reader_destroy(&rd);

	/* ---- issue #10: PeersV1 only from cluster members (auth/cluster.h) ---- */
	if ((m == M_GET_PEER || m == M_UPDATE_GLOBALS) && auth_cluster_peer_token() != NULL) {
		bool ok = false;
		for (size_t i = 0; i < c->req_md.count && !ok; i++) {
			grpc_metadata *md = &c->req_md.metadata[i];
			if (grpc_slice_str_cmp(md->key, AUTH_CLUSTER_PEER_HEADER) == 0)
				ok = auth_cluster_peer_token_ok(
					(const char *)GRPC_SLICE_START_PTR(md->value),
					GRPC_SLICE_LENGTH(md->value));
		}
		if (!ok) {
			sdb_warn("audit", "event=denied what=\"PeersV1 without the cluster token\"%s",
				 "");
			grpc_slice_unref(flat);
			reply(c, GRPC_STATUS_UNAUTHENTICATED, NULL, 0,
			      "PeersV1 needs the cluster token (--cluster-key-file)");
			return;
		}
	}
	pthread_rwlock_rdlock(&srv->fence);
	if (srv->fenced) {
		reply(c, GRPC_STATUS_UNAVAILABLE, NULL, 0, "rate limiter shutting down");
	} else {
		const ProtobufCMessageDescriptor *d = requests[m];
		ProtobufCMessage *msg = NULL;

		if (d != NULL)
			msg = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(flat),
							GRPC_SLICE_START_PTR(flat));
		if (d != NULL && msg == NULL) {
			reply_malformed(c, d->short_name);
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
		if (msg != NULL) /* c may be freed by now (on_decided): msg is not c's */
			protobuf_c_message_free_unpacked(msg, NULL);
	}
	pthread_rwlock_unlock(&srv->fence);
	grpc_slice_unref(flat);
}

static void on_event(rl_grpc_server *srv, srv_call *c, bool ok)
{
	switch (c->state) {
	case SC_REQUESTED:
		if (!ok) { /* server shutting down */
			call_free(c);
			return;
		}
		post_request(srv, c->method);
		c->start_ns = sdb_mono_ns();
		dispatch(c); /* the request message came with the call */
		return;
	case SC_DECIDING:
		return; /* not reached: no batch is pending while deciding */
	case SC_SENDING:
		if (c->method >= 0)
			sdb_histogram_observe_ns(srv->m_latency[c->method], sdb_mono_ns() - c->start_ns);
		call_free(c);
		return;
	}
}

static void *cq_main(void *arg)
{
	rl_grpc_server *srv = arg;

	sdb_log_set_thread("ratelimit", NULL);
	for (;;) {
		grpc_event ev = grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
							   NULL);
		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type != GRPC_OP_COMPLETE)
			continue;
		if (ev.tag == &srv->shutdown_tag) {
			pthread_mutex_lock(&srv->mu);
			srv->shutdown_done = true;
			pthread_cond_broadcast(&srv->cv);
			pthread_mutex_unlock(&srv->mu);
			continue;
		}
		on_event(srv, ev.tag, ev.success != 0);
	}
	return NULL;
}


/* gRPC core logs to stderr in its own multi-line format; route it into the logfmt logger
 * (errors only: its INFO/DEBUG chatter is not an operator's concern). */
static void grpc_log_to_sdb(gpr_log_func_args *a)
{
	char q[1024];

	sdb_log(a->severity == GPR_LOG_SEVERITY_ERROR ? SDB_LOG_ERROR : SDB_LOG_DEBUG, "grpc",
		"detail=%s", sdb_logq(q, sizeof q, a->message != NULL ? a->message : ""));
}

bool rl_v1_reserved(const rl_req *reqs, size_t n, char *msg, size_t msglen)
{
	for (size_t i = 0; i < n; i++)
		if (auth_cluster_reserved_name(reqs[i].name, msg, msglen))
			return true;
	return false;
}

/* ---- issue #10: TLS on the gRPC listener ----
 * When the "ratelimit" TLS listener is configured (tls_setup in rl_grpc_start), the
 * port serves TLS only. gRPC asks this fetcher for the certificate configuration at the
 * start of each handshake: it answers NEW after a SIGHUP reload (tls_reload, the "TLS" hook, bumps
 * the listener's generation), so new connections use the new certificate without a
 * restart; UNCHANGED otherwise, or when the new files cannot be read (old ones stay). */
#define TLS_ROLE "ratelimit"

static grpc_ssl_certificate_config_reload_status tls_fetch(void *arg,
							   grpc_ssl_server_certificate_config **cfg)
{
	rl_grpc_server *srv = arg;
	char *cert, *key, *ca, err[256];
	grpc_ssl_pem_key_cert_pair pair;
	unsigned gen;
	int rc;

	pthread_mutex_lock(&srv->tls_mu);
	gen = srv->tls_gen;
	rc = tls_listener_pem(TLS_ROLE, &gen, &cert, &key, &ca, err, sizeof err);
	if (rc == 1)
		srv->tls_gen = gen;
	pthread_mutex_unlock(&srv->tls_mu);
	if (rc == 0)
		return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
	if (rc < 0) {
		sdb_error("grpc: TLS certificates", "err=\"%s\"", err);
		return gen ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED
			   : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
	}
	pair.private_key = key;
	pair.cert_chain = cert;
	/* gRPC 1.51 asserts pem_root_certs != NULL in a fetched config even when client
	 * certificates are not requested: without --tls-ca give it our own chain, which is
	 * then never used (GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE) */
	*cfg = grpc_ssl_server_certificate_config_create(ca ? ca : cert, &pair, 1); /* copies */
	free(cert);
	memset(key, 0, strlen(key));
	free(key);
	free(ca);
	if (gen > 1)
		sdb_info("grpc: TLS certificate reloaded", "generation=%u", gen);
	return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

/* Insecure credentials, or TLS ones when the listener is configured (with --tls-ca a
 * client certificate signed by it is required: mutual TLS). NULL with err on failure. */
static grpc_server_credentials *server_credentials(rl_grpc_server *srv, char *err,
						   size_t errlen)
{
	grpc_ssl_server_credentials_options *o;
	char *cert, *key, *ca;
	unsigned gen = 0;
	bool mutual;

	if (tls_listener_mode(TLS_ROLE) == TLS_MODE_DISABLED)
		return grpc_insecure_server_credentials_create();
	/* read once now so that bad files fail the start with a clear message */
	if (tls_listener_pem(TLS_ROLE, &gen, &cert, &key, &ca, err, errlen) < 0)
		return NULL;
	mutual = ca != NULL;
	free(cert);
	memset(key, 0, strlen(key));
	free(key);
	free(ca);
	o = grpc_ssl_server_credentials_create_options_using_config_fetcher(
		mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
		       : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
		tls_fetch, srv);
	if (!o) {
		sdb_errf(err, errlen, SDB_EINVAL, "grpc: TLS options refused");
		return NULL;
	}
	sdb_info("grpc: TLS on the listener", "client_cert=%s", mutual ? "required" : "no");
	return grpc_ssl_server_credentials_create_with_options(o); /* takes o */
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

/* The last of srv, after its gRPC server is destroyed and its queue drained (no thread
 * left): the queue, the locks, srv itself and this server's grpc_init reference. */
static void server_release(rl_grpc_server *srv)
{
	grpc_completion_queue_destroy(srv->cq);
	pthread_cond_destroy(&srv->cv);
	pthread_mutex_destroy(&srv->mu);
	pthread_mutex_destroy(&srv->tls_mu);
	pthread_rwlock_destroy(&srv->fence);
	free(srv);
	grpc_shutdown();
}

int rl_grpc_server_new(const rl_grpc_server_opts *opts, rl_grpc_server **out, char *err,
		       size_t errlen)
{
	rl_grpc_server *srv;
	grpc_server_credentials *creds;
	grpc_arg args[1];
	grpc_channel_args chargs;
	int i, rv;

	*out = NULL;
	if (opts->listen == NULL || opts->listen[0] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL, "grpc: no listen address");
	gpr_set_log_function(grpc_log_to_sdb);
	gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
	rl_grpc_tune_runtime();
	grpc_init();
	srv = sdb_calloc(1, sizeof(*srv));
	srv->cluster = opts->cluster;
	srv->n_threads = opts->threads > 0 ? opts->threads : 2;
	if (srv->n_threads > MAX_THREADS)
		srv->n_threads = MAX_THREADS;
	pthread_rwlock_init(&srv->fence, NULL);
	pthread_mutex_init(&srv->mu, NULL);
	pthread_mutex_init(&srv->tls_mu, NULL);
	pthread_cond_init(&srv->cv, NULL);
	for (i = 0; i < M__COUNT; i++) {
		srv->m_calls[i] = sdb_metrics_counter("stripedb_ratelimit_grpc_calls_total",
						      "gRPC calls received by method", method_labels[i]);
		srv->m_latency[i] = sdb_metrics_histogram("stripedb_ratelimit_grpc_call_seconds",
							  "gRPC call latency by method",
							  method_labels[i]);
	}
	SDB_METRICS_REGISTER(srv, grpc_server_metrics, NULL);

	args[0].type = GRPC_ARG_INTEGER;
	args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
	args[0].value.integer = 4 * 1024 * 1024;
	chargs.num_args = 1;
	chargs.args = args;
	srv->server = grpc_server_create(&chargs, NULL);
	srv->cq = grpc_completion_queue_create_for_next(NULL);
	grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
	for (i = 0; i < M__COUNT; i++)
		srv->registered[i] = grpc_server_register_method(
			srv->server, methods[i], NULL, GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
	creds = server_credentials(srv, err, errlen);
	if (creds == NULL) {
		rv = SDB_EINVAL;
		goto err_after_server;
	}
	srv->port = grpc_server_add_http2_port(srv->server, opts->listen, creds);
	grpc_server_credentials_release(creds);
	if (srv->port <= 0) {
		rv = sdb_errf(err, errlen, SDB_EIO, "grpc: cannot listen on %s", opts->listen);
		goto err_after_server;
	}
	grpc_server_start(srv->server);
	for (i = 0; i < M__COUNT; i++)
		for (int k = 0; k < outstanding[i]; k++)
			post_request(srv, i);
	for (i = 0; i < OUTSTANDING_UNKNOWN; i++)
		post_request(srv, -1);
	for (i = 0; i < srv->n_threads; i++) {
		rv = pthread_create(&srv->threads[i], NULL, cq_main, srv);
		if (rv != 0) {
			srv->n_threads = i;
			rl_grpc_server_shutdown(srv);
			rl_grpc_server_free(srv);
			return sdb_errf(err, errlen, SDB_EIO, "grpc: thread: %s", strerror(rv));
		}
	}
	*out = srv;
	return 0;

err_after_server:
	/* never started: no calls, a plain destroy is enough */
	grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
	grpc_server_cancel_all_calls(srv->server);
	grpc_completion_queue_shutdown(srv->cq);
	for (;;) {
		grpc_event ev = grpc_completion_queue_next(srv->cq,
							   gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
	}
	grpc_server_destroy(srv->server);
	server_release(srv);
	return rv;
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
	grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
	grpc_server_cancel_all_calls(srv->server);
	pthread_rwlock_wrlock(&srv->fence);
	srv->fenced = true;
	pthread_rwlock_unlock(&srv->fence);
}

void rl_grpc_server_free(rl_grpc_server *srv)
{
	int i;

	if (srv == NULL)
		return;
	rl_grpc_server_shutdown(srv);
	if (srv->n_threads > 0) {
		pthread_mutex_lock(&srv->mu);
		while (!srv->shutdown_done)
			pthread_cond_wait(&srv->cv, &srv->mu);
		pthread_mutex_unlock(&srv->mu);
	} else {
		/* no thread ever ran: drain here */
		for (;;) {
			grpc_event ev = grpc_completion_queue_next(
				srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
			if (ev.type != GRPC_OP_COMPLETE || ev.tag == &srv->shutdown_tag)
				break;
			on_event(srv, ev.tag, ev.success != 0);
		}
	}
	grpc_server_destroy(srv->server);
	grpc_completion_queue_shutdown(srv->cq);
	if (srv->n_threads == 0) {
		for (;;) {
			grpc_event ev = grpc_completion_queue_next(
				srv->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
			if (ev.type == GRPC_QUEUE_SHUTDOWN)
				break;
			if (ev.type == GRPC_OP_COMPLETE && ev.tag != &srv->shutdown_tag)
				on_event(srv, ev.tag, ev.success != 0);
		}
	}
	for (i = 0; i < srv->n_threads; i++)
		pthread_join(srv->threads[i], NULL);
	server_release(srv);
}

/* ---- role hook ---- */

struct rl_grpc {
	rl_frontend *fe;
	rl_cluster *cluster;
	rl_grpc_server *server;
	rl_membership *membership; /* issue #23: peers from metadata, or NULL */
	sdb_http *http;            /* where GET /debug/ratelimit/peers is routed, or NULL */
};

/* GET /debug/ratelimit/peers (issue #23): this node's ring, as JSON
 * {"advertise", "version", "peers": [{"address", "self", "state": "alive"|"dead",
 * "dead_for_ms"}]} in ring order; version is the metadata membership version the ring
 * was built from (0: --peers or not yet known). */
static void h_debug_peers(void *data, const sdb_http_req *req, sdb_http_resp *resp)
{
	rl_grpc *g = data;
	rl_member m[64];
	uint64_t version = 0;
	size_t n = rl_cluster_members(g->cluster, m, 64, &version), i;
	bson_t doc = BSON_INITIALIZER, arr, d;
	char key[16], *json;

	(void)req;
	BSON_APPEND_UTF8(&doc, "advertise", rl_cluster_advertise(g->cluster));
	BSON_APPEND_INT64(&doc, "version", (int64_t)version);
	BSON_APPEND_INT32(&doc, "peer_count", (int32_t)n);
	bson_append_array_begin(&doc, "peers", -1, &arr);
	for (i = 0; i < n && i < 64; i++) {
		snprintf(key, sizeof key, "%zu", i);
		bson_append_document_begin(&arr, key, -1, &d);
		BSON_APPEND_UTF8(&d, "address", m[i].addr);
		BSON_APPEND_BOOL(&d, "self", m[i].self);
		BSON_APPEND_UTF8(&d, "state", m[i].alive ? "alive" : "dead");
		BSON_APPEND_INT64(&d, "dead_for_ms", m[i].dead_for_ms);
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(&doc, &arr);
	json = bson_as_relaxed_extended_json(&doc, NULL);
	resp->status = 200;
	resp->content_type = "application/json";
	resp->body = sdb_strdup(json);
	resp->body_len = strlen(resp->body);
	bson_free(json);
	bson_destroy(&doc);
}

/* Split a comma-separated list into a NULL-terminated heap array of heap strings. */
static char **split_list(const char *s, size_t *n)
{
	char **v = NULL;
	const char *p = s;

	*n = 0;
	while (p && *p) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		while (len > 0 && (*p == ' ' || *p == '\t')) {
			p++;
			len--;
		}
		while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		if (len > 0) {
			v = sdb_realloc(v, (*n + 2) * sizeof(*v));
			v[(*n)++] = sdb_strndup(p, len);
			v[*n] = NULL;
		}
		p = comma ? comma + 1 : NULL;
	}
	return v;
}

static void free_list(char **v, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* rl_frontend.health adapter: Gubernator's HealthCheck is unhealthy while a peer is
 * unreachable. */
static bool cluster_health(void *ctx, char *msg, size_t msglen)
{
	int peers;

	return rl_cluster_health(ctx, &peers, msg, msglen);
}

int rl_grpc_start(sdb_role *role, rl_frontend *fe, rl_grpc **out, char *err, size_t errlen)
{
	const sdb_config *cfg = role->cfg;
	const char *listen = sdb_config_get(cfg, SDB_OPT_grpc_listen);
	const char *advertise = sdb_config_get(cfg, SDB_OPT_advertise);
	const char *peers_s = sdb_config_get(cfg, SDB_OPT_peers);
	const char *metadata = sdb_config_get(cfg, SDB_OPT_metadata);
	int64_t lease_ms = sdb_config_get_int(cfg, SDB_OPT_ratelimit_lease_ms, 3000);
	rl_cluster_opts copts;
	rl_grpc_server_opts sopts;
	rl_grpc *g;
	char **peers = NULL;
	size_t n_peers = 0;
	int rv;

	*out = NULL;
	if (listen == NULL || *listen == '\0')
		listen = getenv("GUBER_GRPC_ADDRESS");
	if (advertise == NULL || *advertise == '\0')
		advertise = getenv("GUBER_ADVERTISE_ADDRESS");
	if (listen == NULL || *listen == '\0') {
		if (peers_s != NULL && *peers_s != '\0')
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"ratelimit: --peers needs --grpc-listen (or GUBER_GRPC_ADDRESS)");
		sdb_info("ratelimit gRPC not configured (no --grpc-listen)", NULL);
		return 0;
	}
	if (advertise == NULL || *advertise == '\0')
		advertise = listen;
	if ((peers_s == NULL || *peers_s == '\0') && metadata != NULL && *metadata != '\0' &&
	    (lease_ms < 1000 || lease_ms > 600000))
		return sdb_errf(err, errlen, SDB_EUSAGE,
				"--ratelimit-lease-ms must be in 1000..600000, got %lld",
				(long long)lease_ms);

	/* issue #10: TLS of the gRPC listener from --tls-mode/--tls-cert/--tls-key/--tls-ca */
	rv = auth_raft_check_mode(cfg, err, errlen); /* bad usage in every role */
	if (rv == 0)
		rv = tls_setup(cfg, TLS_ROLE, TLS_CLIENTS_INTERNAL, err, errlen);
	if (rv != 0)
		return rv;
	memset(&copts, 0, sizeof(copts));
	rv = rl_cluster_opts_from_env(&copts, err, errlen);
	if (rv != 0)
		return rv;
	if (peers_s != NULL)
		peers = split_list(peers_s, &n_peers);
	copts.advertise = advertise;
	copts.peers = (const char *const *)peers;
	copts.n_peers = n_peers;

	g = sdb_calloc(1, sizeof(*g));
	g->fe = fe;
	rv = rl_cluster_new(fe->limiter, &copts, &g->cluster, err, errlen);
	free_list(peers, n_peers);
	if (rv != 0)
		goto err_after_alloc;

	memset(&sopts, 0, sizeof(sopts));
	sopts.listen = listen;
	sopts.cluster = g->cluster;
	sopts.threads = 2;
	rv = rl_grpc_server_new(&sopts, &g->server, err, errlen);
	if (rv != 0)
		goto err_after_cluster;

	fe->decide = rl_cluster_decide;
	fe->decide_ctx = g->cluster;
	fe->peer_count = rl_cluster_peer_count;
	fe->peer_ctx = g->cluster;
	fe->health = cluster_health;
	sdb_info("ratelimit gRPC listening", "addr=%s port=%d advertise=%s", listen,
		 rl_grpc_server_port(g->server), advertise);
	/* issue #23: without --peers, the peers are whoever registered in metadata */
	if ((peers_s == NULL || *peers_s == '\0') && metadata != NULL && *metadata != '\0') {
		rv = rl_membership_start(metadata, advertise,
					 strcmp(role->def->name, "proxy") == 0 ? "proxy" : "ratelimit",
					 lease_ms, g->cluster, &g->membership, err, errlen);
		if (rv != 0) {
			rl_grpc_stop(g);
			return rv;
		}
	}
	if (role->http != NULL) {
		if (sdb_http_route(role->http, "GET", "/debug/ratelimit/peers", h_debug_peers, g) ==
		    0)
			g->http = role->http;
		else /* another role of this process routed it first */
			sdb_debug("ratelimit: /debug/ratelimit/peers already routed", NULL);
	}
	*out = g;
	return 0;

err_after_cluster:
	rl_cluster_free(g->cluster);
err_after_alloc:
	free(g);
	return rv;
}

void rl_grpc_stop(rl_grpc *g)
{
	if (g == NULL)
		return;
	if (g->http != NULL)
		sdb_http_unroute(g->http, g); /* waits for handlers in flight */
	rl_membership_stop(g->membership); /* deregisters: peers drop this node at once */
	g->fe->decide = rl_decide_local;
	g->fe->decide_ctx = g->fe->limiter;
	g->fe->peer_count = NULL;
	g->fe->peer_ctx = NULL;
	g->fe->health = NULL;
	rl_grpc_server_shutdown(g->server);
	rl_cluster_free(g->cluster);
	rl_grpc_server_free(g->server);
	free(g);
}

int rl_grpc_port(const rl_grpc *g)
{
	return g ? rl_grpc_server_port(g->server) : 0;
}
