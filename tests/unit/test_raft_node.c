/* Unit tests of raft/node.c on a real libuv loop and disk (single-member group):
 * readiness only after the election barrier, proposals and their results, entries that
 * survive a restart without being applied twice, a clean close (no handle left), and
 * the process aborting when a log append fails (libraft 0.15 mitigation).
 *
 * Compiled against node.c itself so the test can swap the wrapped append. */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../raft/node.c"

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ready_propose_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_append_aborts, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unavailable_aborts, setup, teardown),
	};
	return cmocka_run_group_tests_name("raft_node", tests, NULL, NULL);
}
