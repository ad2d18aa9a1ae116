/* Unit tests of src/ratelimit/cluster.c, cluster_global.c, peers.c and grpc_server.c: Go durations, the
 * GUBER_* environment, a cluster of one, and two in-process nodes talking gRPC over
 * loopback (owner forwarding, BATCHING, NO_BATCHING, GLOBAL sync, a dead peer). */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/ratelimit/cluster.c"
#include "../../src/ratelimit/cluster_global.c"
#include "../../src/ratelimit/peers.c"
#include "../../src/ratelimit/grpc_server.c"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/metrics.h"
#include "ratelimit/cluster.h"
#include "ratelimit/grpc_server.h"
#include "ratelimit/limiter.h"

#define T0 1764460800000LL /* 2025-11-30T00:00:00Z, the requests' created_at */

static void test_go_duration(void **state)
{
	int64_t us = -1;

	(void)state;
	assert_int_equal(rl_parse_go_duration("500us", &us), 0);
	assert_int_equal(us, 500);
	assert_int_equal(rl_parse_go_duration("500\xc2\xb5s", &us), 0);
	assert_int_equal(us, 500);
	assert_int_equal(rl_parse_go_duration("100ms", &us), 0);
	assert_int_equal(us, 100000);
	assert_int_equal(rl_parse_go_duration("1.5s", &us), 0);
	assert_int_equal(us, 1500000);
	assert_int_equal(rl_parse_go_duration("1m30s", &us), 0);
	assert_int_equal(us, 90000000);
	assert_int_equal(rl_parse_go_duration("1h", &us), 0);
	assert_int_equal(us, 3600000000LL);
	assert_int_equal(rl_parse_go_duration("2500ns", &us), 0);
	assert_int_equal(us, 2);
	assert_int_equal(rl_parse_go_duration("0", &us), 0);
	assert_int_equal(us, 0);
	assert_int_equal(rl_parse_go_duration("", &us), SDB_EINVAL);
	assert_int_equal(rl_parse_go_duration("10", &us), SDB_EINVAL);
	assert_int_equal(rl_parse_go_duration("10x", &us), SDB_EINVAL);
	assert_int_equal(rl_parse_go_duration("-1s", &us), SDB_EINVAL);
	assert_int_equal(rl_parse_go_duration("ms", &us), SDB_EINVAL);
}

static void test_env(void **state)
{
	rl_cluster_opts o;
	char err[160];

	(void)state;
	memset(&o, 0, sizeof(o));
	setenv("GUBER_BATCH_WAIT", "1ms", 1);
	setenv("GUBER_BATCH_LIMIT", "20", 1);
	setenv("GUBER_BATCH_TIMEOUT", "2s", 1);
	setenv("GUBER_GLOBAL_SYNC_WAIT", "50ms", 1);
	setenv("GUBER_GLOBAL_BATCH_LIMIT", "7", 1);
	o.batch_limit = 5; /* set by a flag: the environment does not override it */
	assert_int_equal(rl_cluster_opts_from_env(&o, err, sizeof(err)), 0);
	assert_int_equal(o.batch_wait_us, 1000);
	assert_int_equal(o.batch_limit, 5);
	assert_int_equal(o.batch_timeout_ms, 2000);
	assert_int_equal(o.global_sync_wait_us, 50000);
	assert_int_equal(o.global_batch_limit, 7);

	memset(&o, 0, sizeof(o));
	setenv("GUBER_BATCH_LIMIT", "lots", 1);
	assert_int_equal(rl_cluster_opts_from_env(&o, err, sizeof(err)), SDB_EUSAGE);
	assert_string_equal(err, "GUBER_BATCH_LIMIT: 'lots' is not an integer in 1..1000");
	unsetenv("GUBER_BATCH_WAIT");
	unsetenv("GUBER_BATCH_LIMIT");
	unsetenv("GUBER_BATCH_TIMEOUT");
	unsetenv("GUBER_GLOBAL_SYNC_WAIT");
	unsetenv("GUBER_GLOBAL_BATCH_LIMIT");
}

/* The limiters' clock: a fixed instant just after T0, so state made with created_at T0
 * is live whatever the real date. */
static int64_t test_clock(void *unused)
{
	(void)unused;
	return T0 + 1000;
}

static rl_limiter *mklimiter(void)
{
	rl_limiter_opts lo;

	memset(&lo, 0, sizeof(lo));
	lo.clock = test_clock;
	return rl_limiter_new(&lo);
}

static rl_req mkreq(const char *uk, int64_t hits, int32_t behavior)
{
	rl_req r;

	memset(&r, 0, sizeof(r));
	r.name = "test_cluster";
	r.unique_key = uk;
	r.hits = hits;
	r.limit = 10;
	r.duration = 60000;
	r.algorithm = RL_TOKEN_BUCKET;
	r.behavior = behavior;
	r.created_at = T0;
	return r;
}

static int fired;
static void count_done(void *arg)
{
	(void)arg;
	fired++;
}

static void test_single_node(void **state)
{
	rl_limiter *lim = mklimiter();
	rl_cluster_opts o;
	rl_cluster *cl = NULL;
	rl_req reqs[3];
	rl_resp out[3];
	char err[160];
	static rl_req many[RL_MAX_BATCH + 1];
	static rl_resp many_out[RL_MAX_BATCH + 1];

	(void)state;
	memset(&o, 0, sizeof(o));
	o.advertise = "127.0.0.1:1";
	assert_int_equal(rl_cluster_new(lim, &o, &cl, err, sizeof(err)), 0);
	assert_int_equal(rl_cluster_peer_count(cl), 1);

	reqs[0] = mkreq("k1", 1, RL_BATCHING);
	reqs[1] = mkreq("k1", 4, RL_NO_BATCHING);
	reqs[2] = mkreq("", 1, 0);
	fired = 0;
	assert_int_equal(rl_cluster_decide_async(cl, reqs, 3, out, count_done, NULL, err,
						 sizeof(err)), 0);
	assert_int_equal(fired, 1); /* all local: done before returning */
	assert_int_equal(out[0].status, RL_UNDER_LIMIT);
	assert_int_equal(out[0].remaining, 9);
	assert_int_equal(out[0].reset_time, T0 + 60000);
	assert_string_equal(out[0].owner, "127.0.0.1:1");
	assert_int_equal(out[1].remaining, 5);
	assert_string_equal(out[2].error, "field 'unique_key' cannot be empty");

	fired = 0;
	assert_int_equal(rl_cluster_decide_async(cl, many, RL_MAX_BATCH + 1, many_out, count_done,
						 NULL, err, sizeof(err)),
			 SDB_EINVAL);
	assert_string_equal(err, "Requests.RateLimits list too large; max size is '1000'");
	assert_int_equal(fired, 0);
	rl_cluster_free(cl);
	rl_limiter_free(lim);
}

static Pb__Gubernator__RateLimitResp__MetadataEntry md(const char *k, const char *v)
{
	Pb__Gubernator__RateLimitResp__MetadataEntry e =
		PB__GUBERNATOR__RATE_LIMIT_RESP__METADATA_ENTRY__INIT;

	e.key = (char *)k;
	e.value = (char *)v;
	return e;
}

/* UpdatePeerGlobals as a receiving peer: a stripedb entry (name, unique_key, sdb_state in
 * status.metadata) replaces the local state; entries without them, with a malformed
 * state or with an invalid algorithm are skipped and leave the state alone. */
static void test_apply_globals(void **state)
{
	rl_limiter *lim = mklimiter();
	rl_cluster_opts o;
	rl_cluster *cl = NULL;
	char err[160], st_ok[200], st_badalg[200];
	Pb__Gubernator__RateLimitResp__MetadataEntry e_ok[3], e_bad[3], e_alg[3], e_gub[1];
	Pb__Gubernator__RateLimitResp__MetadataEntry *p_ok[3], *p_bad[3], *p_alg[3], *p_gub[1];
	Pb__Gubernator__RateLimitResp r_ok = PB__GUBERNATOR__RATE_LIMIT_RESP__INIT,
				      r_bad = PB__GUBERNATOR__RATE_LIMIT_RESP__INIT,
				      r_alg = PB__GUBERNATOR__RATE_LIMIT_RESP__INIT,
				      r_gub = PB__GUBERNATOR__RATE_LIMIT_RESP__INIT;
	Pb__Gubernator__UpdatePeerGlobal g[5];
	Pb__Gubernator__UpdatePeerGlobal *gp[5];
	Pb__Gubernator__UpdatePeerGlobalsReq req = PB__GUBERNATOR__UPDATE_PEER_GLOBALS_REQ__INIT;
	rl_state st;
	rl_req q;
	rl_resp out;
	int i;

	(void)state;
	memset(&o, 0, sizeof(o));
	o.advertise = "127.0.0.1:1";
	o.clock = test_clock;
	assert_int_equal(rl_cluster_new(lim, &o, &cl, err, sizeof(err)), 0);

	/* algorithm,behavior,status,limit,duration,burst,remaining,remaining_f,tat,
	 * created_at,updated_at,expire_at */
	snprintf(st_ok, sizeof(st_ok), "0,2,0,10,60000,0,4,0,0,%lld,%lld,%lld", T0, T0,
		 T0 + 60000);
	snprintf(st_badalg, sizeof(st_badalg), "9,2,0,10,60000,0,1,0,0,%lld,%lld,%lld", T0, T0,
		 T0 + 60000);
	e_ok[0] = md("name", "test_cluster");
	e_ok[1] = md("unique_key", "g1");
	e_ok[2] = md("sdb_state", st_ok);
	e_bad[0] = md("name", "test_cluster");
	e_bad[1] = md("unique_key", "g2");
	e_bad[2] = md("sdb_state", "0,2,0,10,60000,0,x");
	e_alg[0] = md("name", "test_cluster");
	e_alg[1] = md("unique_key", "g3");
	e_alg[2] = md("sdb_state", st_badalg);
	e_gub[0] = md("owner", "127.0.0.1:2");
	for (i = 0; i < 3; i++) {
		p_ok[i] = &e_ok[i];
		p_bad[i] = &e_bad[i];
		p_alg[i] = &e_alg[i];
	}
	p_gub[0] = &e_gub[0];
	r_ok.n_metadata = 3;
	r_ok.metadata = p_ok;
	r_bad.n_metadata = 3;
	r_bad.metadata = p_bad;
	r_alg.n_metadata = 3;
	r_alg.metadata = p_alg;
	r_gub.n_metadata = 1;
	r_gub.metadata = p_gub;
	for (i = 0; i < 5; i++) {
		pb__gubernator__update_peer_global__init(&g[i]);
		gp[i] = &g[i];
	}
	g[0].status = &r_ok;
	g[1].status = &r_bad;
	g[2].status = &r_alg;
	g[3].status = &r_gub; /* from a Gubernator peer: key cannot be split */
	g[3].key = (char *)"test_cluster_g4";
	g[4].status = NULL;
	req.n_globals = 5;
	req.globals = gp;
	rl_cluster_apply_globals(cl, &req);

	assert_int_equal(rl_limiter_get_state(lim, "test_cluster", "g1", &st), 0);
	assert_int_equal(st.remaining, 4);
	assert_int_equal(st.limit, 10);
	assert_int_equal(st.expire_at, T0 + 60000);
	assert_int_equal(rl_limiter_get_state(lim, "test_cluster", "g2", &st), SDB_ENOTFOUND);
	assert_int_equal(rl_limiter_get_state(lim, "test_cluster", "g3", &st), SDB_ENOTFOUND);
	assert_int_equal(rl_limiter_get_state(lim, "test_cluster", "g4", &st), SDB_ENOTFOUND);
	/* later requests for g1 decide from the installed state */
	q = mkreq("g1", 1, RL_GLOBAL);
	q.created_at = T0 + 10;
	assert_int_equal(rl_cluster_decide(cl, &q, 1, &out, err, sizeof(err)), 0);
	assert_string_equal(out.error, "");
	assert_int_equal(out.remaining, 3);
	assert_int_equal(out.reset_time, T0 + 60000);
	rl_cluster_free(cl);
	rl_limiter_free(lim);
}

/* ---- two nodes over loopback gRPC ---- */

typedef struct node {
	char addr[64];
	rl_limiter *lim;
	rl_cluster *cl;
	rl_grpc_server *srv;
} node;

static int free_port(void)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static void node_start(node *n, const char *const *peers, size_t n_peers)
{
	rl_cluster_opts o;
	rl_grpc_server_opts so;
	char err[160];

	memset(&o, 0, sizeof(o));
	o.advertise = n->addr;
	o.peers = peers;
	o.n_peers = n_peers;
	o.batch_wait_us = 2000;
	o.global_sync_wait_us = 20000;
	o.dead_ms = 60000;
	/* peer calls: a deadline past the tests' own waits. At the default 500 ms, a loaded
	 * machine (load average ~12, ASan) timed a GLOBAL hits send out; the sender then marks
	 * the owner dead and sends the hits again (cluster_global.c: counted twice rather than
	 * lost), and test_two_nodes' wait for both nodes at remaining 5 could never end. The
	 * deadline's own behaviour is test_ratelimit_grpc.py's (a hung peer). */
	o.batch_timeout_ms = 10000;
	o.clock = test_clock;
	n->lim = mklimiter();
	assert_int_equal(rl_cluster_new(n->lim, &o, &n->cl, err, sizeof(err)), 0);
	memset(&so, 0, sizeof(so));
	so.listen = n->addr;
	so.cluster = n->cl;
	assert_int_equal(rl_grpc_server_new(&so, &n->srv, err, sizeof(err)), 0);
}

static void node_stop(node *n)
{
	if (n->srv == NULL)
		return;
	rl_grpc_server_shutdown(n->srv);
	rl_cluster_free(n->cl);
	rl_grpc_server_free(n->srv);
	rl_limiter_free(n->lim);
	n->srv = NULL;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A unique_key owned by the node at addr. */
static const char *key_owned_by(rl_cluster *cl, const char *addr, const char *prefix,
				char *buf, size_t n)
{
	int i;

	for (i = 0; i < 10000; i++) {
		snprintf(buf, n, "%s-%d", prefix, i);
		if (strcmp(rl_cluster_owner_of(cl, "test_cluster", buf), addr) == 0)
			return buf;
	}
	fail_msg("no key owned by %s", addr);
	return NULL;
}

static void test_two_nodes(void **state)
{
	node a, b;
	const char *peers[2];
	char kb[32], kg[32], err[160];
	const char *kb_key, *kg_key;
	rl_req r[8];
	rl_resp out[8];
	rl_state st;
	int i;
	int64_t deadline;

	(void)state;
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	{
		int pa = free_port(), pb = free_port();
		while (pb == pa) /* the kernel may hand the same free port out twice */
			pb = free_port();
		snprintf(a.addr, sizeof(a.addr), "127.0.0.1:%d", pa);
		snprintf(b.addr, sizeof(b.addr), "127.0.0.1:%d", pb);
	}
	peers[0] = a.addr;
	peers[1] = b.addr;
	node_start(&a, peers, 2);
	node_start(&b, peers, 2);
	assert_int_equal(rl_cluster_peer_count(a.cl), 2);

	/* forwarding: a key owned by b, decided through a, 8 requests in one BATCHING call */
	kb_key = key_owned_by(a.cl, b.addr, "key", kb, sizeof(kb));
	assert_string_equal(rl_cluster_owner_of(b.cl, "test_cluster", kb_key), b.addr);
	for (i = 0; i < 8; i++)
		r[i] = mkreq(kb_key, 1, i % 2 ? RL_NO_BATCHING : RL_BATCHING);
	assert_int_equal(rl_cluster_decide(a.cl, r, 8, out, err, sizeof(err)), 0);
	for (i = 0; i < 8; i++) {
		assert_string_equal(out[i].error, "");
		assert_string_equal(out[i].owner, b.addr);
		assert_int_equal(out[i].limit, 10);
		assert_int_equal(out[i].reset_time, T0 + 60000);
	}
	/* the owner holds the count: b sees 8 hits taken */
	assert_int_equal(rl_limiter_get_state(b.lim, "test_cluster", kb_key, &st), 0);
	assert_int_equal(st.remaining, 2);
	assert_int_equal(rl_limiter_get_state(a.lim, "test_cluster", kb_key, &st), SDB_ENOTFOUND);
	/* and b answers the same count directly */
	r[0] = mkreq(kb_key, 0, RL_BATCHING);
	assert_int_equal(rl_cluster_decide(b.cl, r, 1, out, err, sizeof(err)), 0);
	assert_int_equal(out[0].remaining, 2);
	assert_string_equal(out[0].owner, b.addr);
	/* over the limit through a: refused, nothing consumed */
	r[0] = mkreq(kb_key, 3, RL_BATCHING);
	assert_int_equal(rl_cluster_decide(a.cl, r, 1, out, err, sizeof(err)), 0);
	assert_int_equal(out[0].status, RL_OVER_LIMIT);
	assert_int_equal(out[0].remaining, 2);

	/* GLOBAL: a key owned by b, hit on a (answered locally), converges on both */
	kg_key = key_owned_by(a.cl, b.addr, "global", kg, sizeof(kg));
	r[0] = mkreq(kg_key, 3, RL_GLOBAL);
	assert_int_equal(rl_cluster_decide(a.cl, r, 1, out, err, sizeof(err)), 0);
	assert_int_equal(out[0].remaining, 7);
	assert_string_equal(out[0].owner, b.addr);
	r[0] = mkreq(kg_key, 2, RL_GLOBAL);
	assert_int_equal(rl_cluster_decide(b.cl, r, 1, out, err, sizeof(err)), 0);
	/* b decides on its own state: a's 3 hits are either not in yet (8) or in (5) */
	assert_true(out[0].remaining == 8 || out[0].remaining == 5);
	deadline = mono_ms() + 10000;
	for (;;) {
		rl_state sa, sb;
		if (rl_limiter_get_state(a.lim, "test_cluster", kg_key, &sa) == 0 &&
		    rl_limiter_get_state(b.lim, "test_cluster", kg_key, &sb) == 0 &&
		    sa.remaining == 5 && sb.remaining == 5)
			break;
		assert_true(mono_ms() < deadline);
		usleep(2000);
	}

	/* b dies: its keys go to a, without errors */
	node_stop(&b);
	r[0] = mkreq(kb_key, 1, RL_BATCHING);
	r[1] = mkreq(kb_key, 1, RL_NO_BATCHING);
	assert_int_equal(rl_cluster_decide(a.cl, r, 2, out, err, sizeof(err)), 0);
	assert_string_equal(out[0].error, "");
	assert_string_equal(out[1].error, "");
	assert_string_equal(out[0].owner, a.addr);
	assert_string_equal(out[1].owner, a.addr);
	/* a fresh bucket on a (state loss is documented); the two requests race, so one of
	 * them saw 9 and the other 8 */
	assert_int_equal(out[0].remaining + out[1].remaining, 17);
	assert_int_equal(out[0].remaining * out[1].remaining, 72);
	{
		int pc = 0;
		char msg[256];
		assert_false(rl_cluster_health(a.cl, &pc, msg, sizeof(msg)));
		assert_int_equal(pc, 2);
	}
	node_stop(&a);
}

/* Live ring changes (rl_cluster_set_peers): two nodes that start alone join each other's
 * ring and agree on every key's owner; then GLOBAL hits queued for an owner that died are
 * delivered to the key's next owner instead of being dropped. */
static void test_ring_change(void **state)
{
	node a, b;
	const char *pa[1], *pb[1];
	char key[32], err[160];
	rl_member m[4];
	uint64_t version = 0;
	int i, owned_b = 0;
	rl_req r;
	rl_resp out;
	rl_state st;
	int64_t deadline;
	sdb_counter *requeued = sdb_metrics_counter(
		"stripedb_ratelimit_global_hits_requeued_total",
		"GLOBAL keys whose hits were queued again after their owner failed", NULL);
	uint64_t requeued0 = sdb_counter_value(requeued);

	(void)state;
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	{
		int p1 = free_port(), p2 = free_port();
		while (p2 == p1)
			p2 = free_port();
		snprintf(a.addr, sizeof(a.addr), "127.0.0.1:%d", p1);
		snprintf(b.addr, sizeof(b.addr), "127.0.0.1:%d", p2);
	}
	node_start(&a, NULL, 0);
	node_start(&b, NULL, 0);
	assert_int_equal(rl_cluster_peer_count(a.cl), 1);
	pa[0] = b.addr;
	pb[0] = a.addr;
	assert_int_equal(rl_cluster_set_peers(a.cl, pa, 1, 7, err, sizeof(err)), 0);
	assert_int_equal(rl_cluster_set_peers(b.cl, pb, 1, 7, err, sizeof(err)), 0);
	assert_int_equal(rl_cluster_peer_count(a.cl), 2);
	/* the same set again: nothing changes */
	assert_int_equal(rl_cluster_set_peers(a.cl, pa, 1, 8, err, sizeof(err)), 0);
	for (i = 0; i < 200; i++) {
		const char *oa, *ob;
		snprintf(key, sizeof(key), "ring-%d", i);
		oa = rl_cluster_owner_of(a.cl, "test_cluster", key);
		ob = rl_cluster_owner_of(b.cl, "test_cluster", key);
		assert_string_equal(oa, ob);
		owned_b += strcmp(oa, b.addr) == 0;
	}
	assert_true(owned_b > 0 && owned_b < 200);
	assert_int_equal(rl_cluster_members(a.cl, m, 4, &version), 2);
	assert_int_equal(version, 8);
	assert_true(strcmp(m[0].addr, m[1].addr) < 0);
	assert_true(m[0].self != m[1].self);
	assert_true(m[0].alive && m[1].alive);

	/* GLOBAL: a key owned by b, hit on a; b is gone before the sync: the hits are
	 * re-queued and land on the next owner (here a itself) */
	node_stop(&b);
	snprintf(key, sizeof(key), "%s", "x");
	key_owned_by(a.cl, b.addr, "gone", key, sizeof(key));
	r = mkreq(key, 3, RL_GLOBAL);
	assert_int_equal(rl_cluster_decide(a.cl, &r, 1, &out, err, sizeof(err)), 0);
	assert_int_equal(out.remaining, 7);
	deadline = mono_ms() + 10000;
	while (sdb_counter_value(requeued) == requeued0) {
		assert_true(mono_ms() < deadline);
		usleep(2000);
	}
	/* the hits were re-queued; the next owner is a itself, whose copy already holds them
	 * (taken when it answered): they are counted once, not applied again (issue #23
	 * retest: 7, not 4), after several sync periods */
	usleep(500 * 1000);
	assert_int_equal(rl_limiter_get_state(a.lim, "test_cluster", key, &st), 0);
	assert_int_equal(st.remaining, 7);
	/* back to a ring of one */
	assert_int_equal(rl_cluster_set_peers(a.cl, NULL, 0, 9, err, sizeof(err)), 0);
	assert_int_equal(rl_cluster_peer_count(a.cl), 1);
	assert_string_equal(rl_cluster_owner_of(a.cl, "test_cluster", key), a.addr);
	node_stop(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_go_duration),
		cmocka_unit_test(test_env),
		cmocka_unit_test(test_single_node),
		cmocka_unit_test(test_apply_globals),
		cmocka_unit_test(test_two_nodes),
		cmocka_unit_test(test_ring_change),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
