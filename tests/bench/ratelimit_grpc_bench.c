/* gRPC load generator for the rate limiter (issue #3, benchmark path (c)). Not part of
 * `make check`; tests/bench/ratelimit_bench.sh runs it against the same stripedb process
 * it drives with wrk.
 *
 *   ratelimit_grpc_bench --addr HOST:PORT [--conns N] [--threads N] [--seconds N]
 *                        [--keys N] [--batch N]
 *
 * A C client on gRPC's C core (the library of the peer client, so the client costs as
 * little as we can make it): --threads threads, each with its own channel (its own TCP
 * connection) and completion queue, keep --conns calls in flight in total ("concurrent
 * clients"). Each call is a pb.gubernator.V1/GetRateLimits with --batch requests
 * (default 1) of the token-bucket workload of ratelimit_bench (limit 100 per minute,
 * hits 1, a random key among --keys). Prints one line:
 *   grpc conns=64 threads=2 batch=1 calls=N decisions=N errors=0 seconds=10.0 rate=N
 *        p50_us=N p99_us=N
 * where rate is decisions per second and p50/p99 are per-call latencies.
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "ratelimit/grpc_server.h"
#include "ratelimit/gubernator_c.pb-c.h"

static const char *opt_str(int argc, char **argv, const char *name, const char *def)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], name) == 0)
			return argv[i + 1];
	return def;
}

static long opt_long(int argc, char **argv, const char *name, long def)
{
	const char *v = opt_str(argc, argv, name, NULL);
	return v ? strtol(v, NULL, 10) : def;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct worker worker;

typedef struct call {
	worker *w;
	grpc_call *call;
	grpc_metadata_array imd, tmd;
	grpc_byte_buffer *send, *recv;
	grpc_status_code status;
	grpc_slice details;
	uint64_t start;
} call;

struct worker {
	int id;
	const char *addr;
	long inflight;
	long keys;
	long batch;
	uint64_t end_ns;
	grpc_channel *ch;
	grpc_completion_queue *cq;
	uint64_t seed;
	uint64_t *lat;
	size_t n_lat, cap_lat;
	long calls, errors;
};

static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static grpc_byte_buffer *make_request(worker *w)
{
	Pb__Gubernator__GetRateLimitsReq m = PB__GUBERNATOR__GET_RATE_LIMITS_REQ__INIT;
	Pb__Gubernator__RateLimitReq *rs = sdb_calloc((size_t)w->batch, sizeof(*rs));
	Pb__Gubernator__RateLimitReq **ps = sdb_calloc((size_t)w->batch, sizeof(*ps));
	char(*keys)[32] = sdb_calloc((size_t)w->batch, 32);
	grpc_byte_buffer *bb;
	grpc_slice s;
	size_t len;
	uint8_t *buf;

	for (long i = 0; i < w->batch; i++) {
		pb__gubernator__rate_limit_req__init(&rs[i]);
		snprintf(keys[i], 32, "k%" PRIu64, next_rand(&w->seed) % (uint64_t)w->keys);
		rs[i].name = (char *)"bench";
		rs[i].unique_key = keys[i];
		rs[i].hits = 1;
		rs[i].limit = 100;
		rs[i].duration = 60000;
		ps[i] = &rs[i];
	}
	m.n_requests = (size_t)w->batch;
	m.requests = ps;
	len = pb__gubernator__get_rate_limits_req__get_packed_size(&m);
	buf = sdb_malloc(len);
	pb__gubernator__get_rate_limits_req__pack(&m, buf);
	s = grpc_slice_from_copied_buffer((const char *)buf, len);
	bb = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	free(buf);
	free(keys);
	free(ps);
	free(rs);
	return bb;
}

static void start_call(worker *w)
{
	call *c = sdb_calloc(1, sizeof(*c));
	grpc_op ops[6];

	c->w = w;
	grpc_metadata_array_init(&c->imd);
	grpc_metadata_array_init(&c->tmd);
	c->details = grpc_empty_slice();
	c->send = make_request(w);
	c->start = now_ns();
	c->call = grpc_channel_create_call(
		w->ch, NULL, GRPC_PROPAGATE_DEFAULTS, w->cq,
		grpc_slice_from_static_string("/pb.gubernator.V1/GetRateLimits"), NULL,
		gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(10, GPR_TIMESPAN)),
		NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = c->send;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->imd;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &c->recv;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &c->tmd;
	ops[5].data.recv_status_on_client.status = &c->status;
	ops[5].data.recv_status_on_client.status_details = &c->details;
	if (grpc_call_start_batch(c->call, ops, 6, c, NULL) != GRPC_CALL_OK) {
		fprintf(stderr, "grpc_call_start_batch failed\n");
		exit(1);
	}
}

static void finish_call(call *c)
{
	worker *w = c->w;
	uint64_t lat = now_ns() - c->start;

	w->calls++;
	if (c->status != GRPC_STATUS_OK || c->recv == NULL) {
		w->errors++;
	} else {
		if (w->n_lat == w->cap_lat) {
			w->cap_lat = w->cap_lat ? w->cap_lat * 2 : 65536;
			w->lat = sdb_realloc(w->lat, w->cap_lat * sizeof(*w->lat));
		}
		w->lat[w->n_lat++] = lat;
	}
	grpc_metadata_array_destroy(&c->imd);
	grpc_metadata_array_destroy(&c->tmd);
	grpc_byte_buffer_destroy(c->send);
	if (c->recv)
		grpc_byte_buffer_destroy(c->recv);
	grpc_slice_unref(c->details);
	grpc_call_unref(c->call);
	free(c);
}

static void *run(void *arg)
{
	worker *w = arg;
	long active = 0;
	grpc_arg a = {.type = GRPC_ARG_INTEGER,
		      .key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
		      .value.integer = 1};
	grpc_channel_args chargs = {.num_args = 1, .args = &a};
	grpc_channel_credentials *creds = grpc_insecure_credentials_create();

	w->ch = grpc_channel_create(w->addr, creds, &chargs);
	grpc_channel_credentials_release(creds);
	w->cq = grpc_completion_queue_create_for_next(NULL);
	for (long i = 0; i < w->inflight; i++, active++)
		start_call(w);
	while (active > 0) {
		grpc_event ev = grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
							   NULL);
		if (ev.type != GRPC_OP_COMPLETE)
			break;
		finish_call(ev.tag);
		active--;
		if (now_ns() < w->end_ns) {
			start_call(w);
			active++;
		}
	}
	grpc_channel_destroy(w->ch);
	grpc_completion_queue_shutdown(w->cq);
	while (grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
	       GRPC_QUEUE_SHUTDOWN)
		;
	grpc_completion_queue_destroy(w->cq);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	const char *addr = opt_str(argc, argv, "--addr", NULL);
	long conns = opt_long(argc, argv, "--conns", 64);
	long threads = opt_long(argc, argv, "--threads", 2);
	long secs = opt_long(argc, argv, "--seconds", 10);
	long keys = opt_long(argc, argv, "--keys", 10000);
	long batch = opt_long(argc, argv, "--batch", 1);
	worker *ws;
	pthread_t *ts;
	uint64_t t0, t1, *all;
	size_t n = 0;
	long calls = 0, errors = 0;
	double seconds;

	if (addr == NULL || conns < 1 || threads < 1 || secs < 1 || keys < 1 || batch < 1 ||
	    batch > 1000) {
		fprintf(stderr, "usage: %s --addr HOST:PORT [--conns N] [--threads N] "
				"[--seconds N] [--keys N] [--batch 1..1000]\n",
			argv[0]);
		return 2;
	}
	if (threads > conns)
		threads = conns;
	rl_grpc_tune_runtime(); /* as the server: no Abseil deadlock detection */
	grpc_init();
	ws = sdb_calloc((size_t)threads, sizeof(*ws));
	ts = sdb_calloc((size_t)threads, sizeof(*ts));
	t0 = now_ns();
	for (long i = 0; i < threads; i++) {
		ws[i].id = (int)i;
		ws[i].addr = addr;
		ws[i].inflight = conns / threads + (i < conns % threads ? 1 : 0);
		ws[i].keys = keys;
		ws[i].batch = batch;
		ws[i].end_ns = t0 + (uint64_t)secs * 1000000000u;
		ws[i].seed = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
		pthread_create(&ts[i], NULL, run, &ws[i]);
	}
	for (long i = 0; i < threads; i++)
		pthread_join(ts[i], NULL);
	t1 = now_ns();
	for (long i = 0; i < threads; i++) {
		n += ws[i].n_lat;
		calls += ws[i].calls;
		errors += ws[i].errors;
	}
	all = sdb_calloc(n ? n : 1, sizeof(*all));
	n = 0;
	for (long i = 0; i < threads; i++) {
		memcpy(all + n, ws[i].lat, ws[i].n_lat * sizeof(*all));
		n += ws[i].n_lat;
		free(ws[i].lat);
	}
	qsort(all, n, sizeof(*all), cmp_u64);
	seconds = (double)(t1 - t0) / 1e9;
	printf("grpc conns=%ld threads=%ld batch=%ld calls=%ld decisions=%ld errors=%ld "
	       "seconds=%.3f rate=%.0f p50_us=%.1f p99_us=%.1f\n",
	       conns, threads, batch, calls, (long)n * batch, errors, seconds,
	       (double)n * (double)batch / seconds, n ? (double)all[n / 2] / 1000.0 : 0.0,
	       n ? (double)all[(n * 99) / 100] / 1000.0 : 0.0);
	free(all);
	free(ws);
	free(ts);
	grpc_shutdown();
	return errors ? 1 : 0;
}
