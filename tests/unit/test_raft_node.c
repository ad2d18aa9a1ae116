/* Unit tests of raft/node.c on a real libuv loop and disk (single-member group):
 * readiness only after the election barrier, proposals and their results, entries that
 * survive a restart without being applied twice, a clean close (no handle left), the
 * process aborting when a log append fails (libraft 0.15 mitigation), and foreign peers
 * on the Raft port (garbage, another cluster's members, connections cut mid-message)
 * changing nothing.
 *
 * Compiled against node.c itself so the test can swap the wrapped append. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../raft/node.c"

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <netinet/in.h>
#include <sys/socket.h>

typedef struct env {
	uv_loop_t loop;
	char dir[64];
	char addr[64];
	sdb_node *node;
	int done;
	int status;
	bson_t *result;
	int closed;
} env;

static int free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof a;
	assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *)&a, &l), 0);
	close(s);
	return ntohs(a.sin_port);
}

static void start(env *e)
{
	char err[256], members[96];
	sdb_node_opts o = {0};
	snprintf(members, sizeof members, "1@%s", e->addr);
	o.id = 1;
	o.data_dir = e->dir;
	o.raft_addr = e->addr;
	o.bootstrap = members;
	o.election_timeout_ms = 200;
	o.snapshot_threshold = 64;
	if (sdb_node_start(&e->loop, &o, &e->node, err, sizeof err) != 0)
		fail_msg("start: %s", err);
}

static int setup(void **state)
{
	env *e = calloc(1, sizeof *e);
	assert_int_equal(uv_loop_init(&e->loop), 0);
	strcpy(e->dir, "/tmp/sdb-node-XXXXXX");
	assert_non_null(mkdtemp(e->dir));
	snprintf(e->addr, sizeof e->addr, "127.0.0.1:%d", free_port());
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	env *e = *state;
	char cmd[128];
	assert_int_equal(uv_loop_close(&e->loop), 0); /* every handle was closed */
	snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
	assert_int_equal(system(cmd), 0);
	free(e);
	return 0;
}

/* Run the loop until cond(e) or ~10 s of loop time. */
static int run_until(env *e, int (*cond)(env *e))
{
	uint64_t deadline = uv_now(&e->loop) + 10000;
	while (!cond(e) && uv_now(&e->loop) < deadline)
		uv_run(&e->loop, UV_RUN_ONCE);
	return cond(e);
}

static int is_ready(env *e) { return sdb_node_ready(e->node); }
static int is_done(env *e) { return e->done; }
static int is_closed(env *e) { return e->closed; }

static void on_applied(void *arg, int status, bson_t *result)
{
	env *e = arg;
	e->done = 1;
	e->status = status;
	e->result = result;
}

static void on_closed(void *arg)
{
	((env *)arg)->closed = 1;
}

static void stop(env *e)
{
	e->closed = 0;
	sdb_node_close(e->node, on_closed, e);
	assert_true(run_until(e, is_closed));
	uv_run(&e->loop, UV_RUN_DEFAULT); /* let libuv finish closing */
	e->node = NULL;
}

static double propose(env *e, const char *op, const char *json)
{
	bson_error_t be;
	bson_t *args = bson_new_from_json((const uint8_t *)json, -1, &be);
	bson_iter_t it;
	double ok;
	assert_non_null(args);
	e->done = 0;
	e->result = NULL;
	assert_int_equal(sdb_node_propose(e->node, op, args, on_applied, e), 0);
	bson_destroy(args);
	assert_true(run_until(e, is_done));
	assert_int_equal(e->status, 0);
	assert_true(bson_iter_init_find(&it, e->result, "ok"));
	ok = bson_iter_as_double(&it);
	bson_destroy(e->result);
	return ok;
}

static void test_ready_propose_restart(void **state)
{
	env *e = *state;
	bson_t args = BSON_INITIALIZER;
	start(e);
	/* not ready (and proposals refused) before the election barrier applied */
	assert_false(sdb_node_ready(e->node));
	assert_int_equal(sdb_node_propose(e->node, "addShard", &args, on_applied, e), SDB_ENOTLEADER);
	assert_true(run_until(e, is_ready));
	/* a dropped InstallSnapshot is sent again after four election timeouts, not
	 * libraft's default 30 s (node.c) */
	assert_int_equal(sdb_node_raft(e->node)->install_snapshot_timeout,
			 SDB_NODE_SNAPSHOT_RESEND_ELECTIONS * 200);
	/* odd-sized commands (padded to 8 bytes in the log) */
	assert_true(propose(e, "addShard", "{\"id\": \"a\", \"uri\": \"mongodb://a\"}") == 1.0);
	assert_true(propose(e, "addShard", "{\"id\": \"bb\", \"uri\": \"mongodb://bb:1\"}") == 1.0);
	assert_true(propose(e, "addShard", "{\"id\": \"a\", \"uri\": \"x\"}") == 0.0); /* duplicate */
	uint64_t h = sdb_fsm_hash(sdb_node_fsm(e->node));
	uint64_t applied = sdb_fsm_last_applied(sdb_node_fsm(e->node));
	stop(e);

	/* restart: the log is replayed, nothing applies twice, state is identical */
	start(e);
	assert_true(run_until(e, is_ready));
	assert_true(sdb_fsm_hash(sdb_node_fsm(e->node)) == h);
	assert_int_equal(sdb_fsm_last_applied(sdb_node_fsm(e->node)), applied);
	assert_true(propose(e, "addShard", "{\"id\": \"c\", \"uri\": \"mongodb://c\"}") == 1.0);
	stop(e);
}

static int fail_append(struct raft_io *io, struct raft_io_append *req,
		       const struct raft_entry entries[], unsigned n, raft_io_append_cb cb)
{
	(void)io;
	(void)entries;
	(void)n;
	(void)cb;
	(void)req;
	return RAFT_IOERR;
}

/* A failed disk append must take the process down (raft/README.md). */
static void test_failed_append_aborts(void **state)
{
	env *e = *state;
	int st;
	pid_t pid;
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		env *c = e;
		bson_t args = BSON_INITIALIZER;
		start(c);
		if (!run_until(c, is_ready))
			_exit(3);
		c->node->orig_append = fail_append;
		BSON_APPEND_UTF8(&args, "id", "x");
		sdb_node_propose(c->node, "addShard", &args, on_applied, c);
		run_until(c, is_done);
		_exit(4); /* must not get here */
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGABRT);
}

/* libraft 0.15 going silent in the unavailable state (after an I/O error it handled
 * itself) must take the process down too. */
static void test_unavailable_aborts(void **state)
{
	env *e = *state;
	int st;
	pid_t pid;
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		start(e);
		if (!run_until(e, is_ready))
			_exit(3);
		e->node->raft.state = RAFT_UNAVAILABLE; /* what libraft does on such errors */
		for (int i = 0; i < 100; i++)
			uv_run(&e->loop, UV_RUN_ONCE);
		_exit(4); /* must not get here */
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGABRT);
}

/* ---------------------------------------------------------------- foreign peers */

static int g_fd = -1;    /* the foreign client's socket */
static int g_eof;        /* the node closed it */

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Append libraft's preamble (protocol 1, id, padded address) at out; returns its length. */
static size_t preamble(uint8_t *out, uint64_t id, const char *addr)
{
	size_t alen = strlen(addr), padded = (alen + 1 + 7) & ~(size_t)7;
	memset(out, 0, 24 + padded);
	put64(out, 1);
	put64(out + 8, id);
	put64(out + 16, padded);
	memcpy(out + 24, addr, alen);
	return 24 + padded;
}

/* A message preamble (type, header length) at out; returns 16. */
static size_t msg(uint8_t *out, uint64_t type, uint64_t hdr_len)
{
	put64(out, type);
	put64(out + 8, hdr_len);
	return 16;
}

static int peer_closed(env *e)
{
	char b[256];
	ssize_t r;
	(void)e;
	if (g_eof)
		return 1;
	r = recv(g_fd, b, sizeof b, MSG_DONTWAIT);
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
		g_eof = 1;
	return g_eof;
}

static void foreign_connect(env *e)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	const char *colon = strrchr(e->addr, ':');
	a.sin_port = htons((uint16_t)atoi(colon + 1));
	g_fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(g_fd >= 0);
	assert_int_equal(connect(g_fd, (struct sockaddr *)&a, sizeof a), 0); /* in the backlog */
	g_eof = 0;
}

/* Send len bytes from a new connection; expect the node to close it (refused). */
static void send_refused(env *e, const uint8_t *b, size_t len, const char *what)
{
	foreign_connect(e);
	assert_int_equal(send(g_fd, b, len, MSG_NOSIGNAL), (ssize_t)len);
	if (!run_until(e, peer_closed))
		fail_msg("the node kept a connection that sent %s", what);
	close(g_fd);
	g_fd = -1;
}

/* Send len bytes and close (cut mid-message); run the loop a while. */
static void send_cut(env *e, const uint8_t *b, size_t len)
{
	foreign_connect(e);
	assert_int_equal(send(g_fd, b, len, MSG_NOSIGNAL), (ssize_t)len);
	close(g_fd);
	g_fd = -1;
	for (int i = 0; i < 20; i++)
		uv_run(&e->loop, UV_RUN_NOWAIT);
}

/* Garbage, another cluster's members (valid libraft messages with a higher term) and
 * connections cut mid-message reach the Raft port of a one-member group; the member must
 * refuse them without crashing (ASan) and keep its term, leadership and state. */
static void test_foreign_peers(void **state)
{
	env *e = *state;
	uint8_t b[4096];
	size_t o;
	uint64_t term, h;
	start(e);
	assert_true(run_until(e, is_ready));
	assert_true(propose(e, "addShard", "{\"id\": \"a\", \"uri\": \"mongodb://a\"}") == 1.0);
	term = e->node->raft.current_term;
	h = sdb_fsm_hash(sdb_node_fsm(e->node));

	/* (a) garbage */
	for (size_t i = 0; i < sizeof b; i++)
		b[i] = (uint8_t)(i * 131 + 7);
	send_refused(e, b, sizeof b, "random bytes");
	/* a preamble with an unterminated address (libraft would strlen past it) */
	o = preamble(b, 1, e->addr);
	memset(b + 24, 'x', o - 24);
	send_refused(e, b, o, "an unterminated address");
	/* our own id and address (passes the configuration check), then bad messages */
	{
		struct {
			uint64_t type, len;
			const char *what;
		} bad[] = {
			{3, 1, "a 1-byte RequestVote (libraft reads 40)"},
			{4, 8, "a short RequestVoteResult"},
			{2, 16, "a short AppendEntriesResult"},
			{9, 24, "an unknown message type"},
			{1, 24, "a short AppendEntries"},
			{3, 1ull << 40, "a 1 TiB header"},
		};
		for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
			o = preamble(b, 1, e->addr);
			o += msg(b + o, bad[k].type, bad[k].len);
			memset(b + o, 0, 64);
			send_refused(e, b, o + (bad[k].len < 64 ? bad[k].len : 64), bad[k].what);
		}
		/* AppendEntries claiming 2^40 entries in a 56-byte header */
		o = preamble(b, 1, e->addr);
		o += msg(b + o, 1, 56);
		memset(b + o, 0, 56);
		put64(b + o + 32, 1ull << 40);
		send_refused(e, b, o + 56, "an entry count beyond the header");
		/* AppendEntries with one entry of an unknown type */
		o = preamble(b, 1, e->addr);
		o += msg(b + o, 1, 56);
		memset(b + o, 0, 56);
		put64(b + o + 32, 1);
		b[o + 40 + 8] = 77;
		b[o + 40 + 12] = 8;
		send_refused(e, b, o + 56, "an entry of unknown type");
		/* InstallSnapshot with an empty configuration (libraft asserts) */
		o = preamble(b, 1, e->addr);
		o += msg(b + o, 5, 56);
		memset(b + o, 0, 56);
		put64(b + o + 40, 1); /* data length after a 0-byte configuration */
		send_refused(e, b, o + 56, "an empty snapshot configuration");
		/* InstallSnapshot with a server address running off the configuration */
		o = preamble(b, 1, e->addr);
		o += msg(b + o, 5, 72);
		memset(b + o, 0, 72);
		put64(b + o + 32, 16);
		b[o + 40] = 1;            /* format */
		put64(b + o + 41, 1);     /* one server */
		memset(b + o + 49, 'y', 7); /* id: 7 of 8 bytes, then no room for the address */
		put64(b + o + 56, 8);
		send_refused(e, b, o + 72, "a truncated snapshot configuration");
	}

	/* (b) another cluster's members: well-formed libraft traffic, higher term */
	{
		const char *who[][2] = {{"2", "127.0.0.1:1"}, {"1", "127.0.0.1:2"}};
		for (size_t k = 0; k < 2; k++) {
			o = preamble(b, (uint64_t)atoi(who[k][0]), who[k][1]);
			o += msg(b + o, 3, 40); /* RequestVote term 1000, disrupt the leader */
			put64(b + o, term + 1000);
			put64(b + o + 8, (uint64_t)atoi(who[k][0]));
			put64(b + o + 16, 1000);
			put64(b + o + 24, term + 999);
			put64(b + o + 32, 1);
			o += 40;
			o += msg(b + o, 1, 48); /* AppendEntries, term 1000, no entries */
			memset(b + o, 0, 48);
			put64(b + o, term + 1000);
			o += 48;
			send_refused(e, b, o, "another cluster's RequestVote and AppendEntries");
		}
	}

	/* (c) connections cut mid-preamble, mid-header and mid-payload */
	o = preamble(b, 1, e->addr);
	send_cut(e, b, 10);
	o += msg(b + o, 1, 56);
	send_cut(e, b, o + 20);
	memset(b + o, 0, 56);
	put64(b + o, 0); /* term 0: stale, libraft rejects it once whole */
	put64(b + o + 32, 1);
	b[o + 40 + 8] = 1;
	b[o + 40 + 12] = 200; /* 200 payload bytes announced, 30 sent */
	send_cut(e, b, o + 56 + 30);

	/* nothing changed: still leader in the same term, same state, still writable */
	assert_int_equal(raft_state(&e->node->raft), RAFT_LEADER);
	assert_int_equal(e->node->raft.current_term, term);
	assert_true(sdb_fsm_hash(sdb_node_fsm(e->node)) == h);
	assert_true(propose(e, "addShard", "{\"id\": \"b\", \"uri\": \"mongodb://b\"}") == 1.0);
	stop(e);
}

/* ---- close while the last segment is finalized (libraft 0.15 fires io close twice) ----
 *
 * raft_close closes the current open segment: libraft queues its finalize (truncate and
 * rename on the thread pool) and closes the segment's writer handles, but its "everything
 * closed" check (uvMaybeFireCloseCb) does not count that writer. When the finalize ends
 * before the writer's handles are closed, libraft calls the io close callback, and calls
 * it again from the writer's close callback. A member that freed libraft's io in the
 * first call (raft_uv_close) had the second call read freed memory: a shard or metadata
 * member crashed in libraft at a graceful stop (SEGV in ioCloseCb, seen under load in
 * test_proxy.py's teardown). This test orders the loop so that it happens every time:
 * the close starts in a close callback (as a role's stop does, after its wire server's
 * handles closed), so the writer's handles close in the next loop iteration's closing
 * phase; before that iteration polls, the loop waits for a work item queued behind the
 * finalize on a one-thread pool (UV_THREADPOOL_SIZE=1, set in main), so the finalize's
 * completion is polled first; the closing phase then runs the tick timer's and the
 * listener's close callbacks (closed last, run first) before the writer's. */

typedef struct close_race {
	env *e;
	uv_idle_t trigger;
	uv_prepare_t hold;
	uv_work_t behind;
	uv_sem_t ran;
	int held;
} close_race;

static void behind_work(uv_work_t *w)
{
	close_race *cr = w->data;
	uv_sem_post(&cr->ran);
}

static void behind_after(uv_work_t *w, int status)
{
	(void)w;
	(void)status;
}

static void hold_closed(uv_handle_t *h)
{
	(void)h;
}

/* Prepare phase of the iteration after the close began (just before it polls): queue a
 * work item behind the finalize and wait until the one pool thread runs it, so the
 * finalize has ended and posted its completion to the loop. */
static void hold_cb(uv_prepare_t *p)
{
	close_race *cr = p->data;
	uv_prepare_stop(p);
	uv_close((uv_handle_t *)p, hold_closed);
	cr->behind.data = cr;
	assert_int_equal(uv_queue_work(&cr->e->loop, &cr->behind, behind_work, behind_after), 0);
	uv_sem_wait(&cr->ran);
	cr->held = 1;
}

/* A closing phase: begin the node's close here, as a role's stop does. */
static void trigger_closed(uv_handle_t *h)
{
	close_race *cr = h->data;
	cr->e->closed = 0;
	sdb_node_close(cr->e->node, on_closed, cr->e);
	uv_prepare_init(&cr->e->loop, &cr->hold);
	cr->hold.data = cr;
	uv_prepare_start(&cr->hold, hold_cb);
}

static void test_close_while_segment_finalizes(void **state)
{
	env *e = *state;
	close_race cr = {.e = e};
	start(e);
	assert_true(run_until(e, is_ready));
	/* entries in the open segment, which the close then finalizes */
	assert_true(propose(e, "addShard", "{\"id\": \"a\", \"uri\": \"mongodb://a\"}") == 1.0);
	assert_true(propose(e, "addShard", "{\"id\": \"b\", \"uri\": \"mongodb://b\"}") == 1.0);
	assert_int_equal(uv_sem_init(&cr.ran, 0), 0);
	uv_idle_init(&e->loop, &cr.trigger);
	cr.trigger.data = &cr;
	uv_close((uv_handle_t *)&cr.trigger, trigger_closed);
	assert_true(run_until(e, is_closed));
	uv_run(&e->loop, UV_RUN_DEFAULT); /* the writer's close callbacks, and the free */
	assert_true(cr.held);
	uv_sem_destroy(&cr.ran);
	e->node = NULL;
}

int main(void)
{
	/* one pool thread: test_close_while_segment_finalizes orders work behind libraft's
	 * (libuv reads this when its pool first starts) */
	setenv("UV_THREADPOOL_SIZE", "1", 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ready_propose_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_append_aborts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unavailable_aborts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_foreign_peers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_while_segment_finalizes, setup,
						teardown),
	};
	return cmocka_run_group_tests_name("raft_node", tests, NULL, NULL);
}
