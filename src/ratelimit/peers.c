/* gRPC C core client to rate-limit peers (see peers.h). */
#include "ratelimit/peers.h"
#include "ratelimit/grpc_server.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"

struct rl_peer {
	rl_peers *owner;
	char *addr;
	grpc_channel *channel;
	rl_peer *next;
};

/* One call in flight; freed on the completion thread after its callback. */
typedef struct peer_call {
	rl_peers *peers;
	grpc_call *call;
	rl_peer_cb cb;
	void *arg;
	grpc_metadata_array initial_md;
	grpc_metadata_array trailing_md;
	grpc_byte_buffer *send;
	grpc_byte_buffer *recv;
	grpc_status_code status;
	grpc_slice details;
	struct peer_call *prev, *next; /* in-flight list */
} peer_call;

struct rl_peers {
	grpc_completion_queue *cq;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t drained;
	bool closing;
	size_t inflight;
	peer_call *calls; /* in-flight list, under mu */
	rl_peer *list;    /* channels, under mu */
};

static void call_finish(peer_call *c)
{
	rl_peers *p = c->peers;
	const uint8_t *data = NULL;
	size_t len = 0;
	grpc_slice flat = grpc_empty_slice();
	char *details = NULL;
	int status = (int)c->status;

	/* unlink first: rl_peers_free cancels what is on the list */
	pthread_mutex_lock(&p->mu);
	if (c->prev)
		c->prev->next = c->next;
	else
		p->calls = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&p->mu);

	if (status == GRPC_STATUS_OK && c->recv != NULL) {
		grpc_byte_buffer_reader rd;
		if (grpc_byte_buffer_reader_init(&rd, c->recv)) {
			flat = grpc_byte_buffer_reader_readall(&rd);
			grpc_byte_buffer_reader_destroy(&rd);
			data = GRPC_SLICE_START_PTR(flat);
			len = GRPC_SLICE_LENGTH(flat);
		} else {
			status = GRPC_STATUS_INTERNAL;
		}
	} else if (status == GRPC_STATUS_OK) {
		status = GRPC_STATUS_INTERNAL; /* a unary call must carry a reply */
	}
	details = grpc_slice_to_c_string(c->details);
	c->cb(c->arg, status, data, len, details ? details : "");
	gpr_free(details);
	grpc_slice_unref(flat);

	grpc_metadata_array_destroy(&c->initial_md);
	grpc_metadata_array_destroy(&c->trailing_md);
	if (c->send)
		grpc_byte_buffer_destroy(c->send);
	if (c->recv)
		grpc_byte_buffer_destroy(c->recv);
	grpc_slice_unref(c->details);
	grpc_call_unref(c->call);

	pthread_mutex_lock(&p->mu);
	p->inflight--;
	if (p->inflight == 0)
		pthread_cond_broadcast(&p->drained);
	pthread_mutex_unlock(&p->mu);
	free(c);
}

static void *cq_thread(void *arg)
{
	rl_peers *p = arg;

	sdb_log_set_thread_role("ratelimit"); /* the node id: from the thread that started it */
	for (;;) {
		grpc_event ev = grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
							   NULL);
		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type == GRPC_OP_COMPLETE)
			call_finish(ev.tag);
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

int rl_peers_new(rl_peers **out, char *err, size_t errlen)
{
	rl_peers *p = sdb_calloc(1, sizeof(*p));
	int rv;

	gpr_set_log_function(grpc_log_to_sdb);
	gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
	rl_grpc_tune_runtime();
	grpc_init();
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->drained, NULL);
	p->cq = grpc_completion_queue_create_for_next(NULL);
	rv = sdb_thread_create(&p->thread, cq_thread, p);
	if (rv != 0) {
		grpc_completion_queue_shutdown(p->cq);
		grpc_completion_queue_destroy(p->cq);
		pthread_cond_destroy(&p->drained);
		pthread_mutex_destroy(&p->mu);
		free(p);
		grpc_shutdown();
		*out = NULL;
		return sdb_errf(err, errlen, SDB_EIO, "peers: thread: %s", strerror(rv));
	}
	*out = p;
	return 0;
}

void rl_peers_free(rl_peers *p)
{
	peer_call *c;
	rl_peer *peer, *next;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->closing = true;
	for (c = p->calls; c != NULL; c = c->next)
		grpc_call_cancel(c->call, NULL);
	while (p->inflight > 0)
		pthread_cond_wait(&p->drained, &p->mu);
	peer = p->list;
	p->list = NULL;
	pthread_mutex_unlock(&p->mu);

	for (; peer != NULL; peer = next) {
		next = peer->next;
		grpc_channel_destroy(peer->channel);
		free(peer->addr);
		free(peer);
	}
	grpc_completion_queue_shutdown(p->cq);
	pthread_join(p->thread, NULL);
	grpc_completion_queue_destroy(p->cq);
	pthread_cond_destroy(&p->drained);
	pthread_mutex_destroy(&p->mu);
	free(p);
	grpc_shutdown();
}

/* issue #10: with --tls-internal, TLS to the peer (server verified against --tls-ca,
 * --tls-cert/--tls-key presented), read when the channel is made; never a silent fallback
 * to plaintext: unreadable files give TLS credentials without our CA, so the handshake
 * fails and the peer is reported unreachable. */
static grpc_channel_credentials *peer_credentials(const char *addr)
{
	grpc_channel_credentials *creds;
	grpc_ssl_pem_key_cert_pair pair;
	char *ca = NULL, *cert = NULL, *key = NULL, err[256];

	if (!auth_cluster_tls_enabled())
		return grpc_insecure_credentials_create();
	if (auth_cluster_tls_pem(&ca, &cert, &key, err, sizeof err) != 0)
		sdb_error("ratelimit: peer TLS credentials", "peer=%s err=\"%s\"", addr, err);
	pair.private_key = key;
	pair.cert_chain = cert;
	creds = grpc_ssl_credentials_create(ca, cert && key ? &pair : NULL, NULL, NULL);
	free(ca);
	free(cert);
	if (key) {
		memset(key, 0, strlen(key));
		free(key);
	}
	return creds;
}

rl_peer *rl_peers_connect(rl_peers *p, const char *addr)
{
	rl_peer *peer = sdb_calloc(1, sizeof(*peer));
	grpc_channel_credentials *creds = peer_credentials(addr);
	grpc_arg args[4];
	grpc_channel_args chargs;

	args[0].type = GRPC_ARG_INTEGER;
	args[0].key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
	args[0].value.integer = 1000;
	args[1].type = GRPC_ARG_INTEGER;
	args[1].key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
	args[1].value.integer = 100;
	args[2].type = GRPC_ARG_INTEGER;
	args[2].key = (char *)GRPC_ARG_MIN_RECONNECT_BACKOFF_MS;
	args[2].value.integer = 100;
	args[3].type = GRPC_ARG_INTEGER;
	args[3].key = (char *)GRPC_ARG_ENABLE_RETRIES; /* we re-route ourselves */
	args[3].value.integer = 0;
	chargs.num_args = 4;
	chargs.args = args;

	peer->owner = p;
	peer->addr = sdb_strdup(addr);
	peer->channel = grpc_channel_create(addr, creds, &chargs);
	grpc_channel_credentials_release(creds);
	pthread_mutex_lock(&p->mu);
	peer->next = p->list;
	p->list = peer;
	pthread_mutex_unlock(&p->mu);
	return peer;
}

const char *rl_peer_addr(const rl_peer *peer)
{
	return peer->addr;
}

int rl_peer_call(rl_peer *peer, const char *method, const uint8_t *req, size_t len,
		 int64_t timeout_ms, rl_peer_cb cb, void *arg)
{
	rl_peers *p = peer->owner;
	peer_call *c;
	grpc_slice slice;
	grpc_op ops[6];
	grpc_call_error ce;
	gpr_timespec deadline;

	c = sdb_calloc(1, sizeof(*c));
	c->peers = p;
	c->cb = cb;
	c->arg = arg;
	c->details = grpc_empty_slice();
	grpc_metadata_array_init(&c->initial_md);
	grpc_metadata_array_init(&c->trailing_md);
	slice = grpc_slice_from_copied_buffer((const char *)req, len);
	c->send = grpc_raw_byte_buffer_create(&slice, 1);
	grpc_slice_unref(slice);

	deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
				gpr_time_from_millis(timeout_ms > 0 ? timeout_ms : 1, GPR_TIMESPAN));

	pthread_mutex_lock(&p->mu);
	if (p->closing) {
		pthread_mutex_unlock(&p->mu);
		grpc_byte_buffer_destroy(c->send);
		grpc_metadata_array_destroy(&c->initial_md);
		grpc_metadata_array_destroy(&c->trailing_md);
		free(c);
		return SDB_ECANCELED;
	}
	c->call = grpc_channel_create_call(peer->channel, NULL, GRPC_PROPAGATE_DEFAULTS, p->cq,
					   grpc_slice_from_static_string(method), NULL, deadline,
					   NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[0].data.send_initial_metadata.count = 0;
	/* issue #10: the cluster token on PeersV1 calls (auth/cluster.h) */
	grpc_metadata token_md;
	if (auth_cluster_peer_token()) {
		memset(&token_md, 0, sizeof token_md);
		token_md.key = grpc_slice_from_static_string(AUTH_CLUSTER_PEER_HEADER);
		token_md.value = grpc_slice_from_static_string(auth_cluster_peer_token());
		ops[0].data.send_initial_metadata.count = 1;
		ops[0].data.send_initial_metadata.metadata = &token_md;
	}
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = c->send;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->initial_md;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &c->recv;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &c->trailing_md;
	ops[5].data.recv_status_on_client.status = &c->status;
	ops[5].data.recv_status_on_client.status_details = &c->details;
	ce = grpc_call_start_batch(c->call, ops, 6, c, NULL);
	if (ce != GRPC_CALL_OK) {
		pthread_mutex_unlock(&p->mu);
		grpc_call_unref(c->call);
		grpc_byte_buffer_destroy(c->send);
		grpc_metadata_array_destroy(&c->initial_md);
		grpc_metadata_array_destroy(&c->trailing_md);
		free(c);
		return SDB_EIO;
	}
	c->next = p->calls;
	if (p->calls)
		p->calls->prev = c;
	p->calls = c;
	p->inflight++;
	pthread_mutex_unlock(&p->mu);
	return 0;
}

size_t rl_peers_inflight(rl_peers *p)
{
	size_t n;

	pthread_mutex_lock(&p->mu);
	n = p->inflight;
	pthread_mutex_unlock(&p->mu);
	return n;
}
