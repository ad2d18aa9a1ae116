/* A stand-alone wire protocol server for tests/integration/test_wire.py: the shared
 * commands of src/wire plus three test commands, on one libuv loop.
 *
 *   wire_test_server --listen=HOST:PORT [--http-listen=HOST:PORT] [--close-timeout-ms=N]
 *                    [--debug]
 *                    prints "port=N" on stdout once listening; with --http-listen it also
 *                    serves /healthz and /metrics (common/http.h); --close-timeout-ms is
 *                    wire_server_close's timeout at SIGTERM (default 5000)
 *
 * Test commands (handlers complete from another thread than the loop's):
 *   {stripedbTestSleep: MS}   reply {slept: MS} after MS ms (at most 10000); with
 *                             `waiting: true` the sleep is bracketed by
 *                             wire_req_wait_begin/_end (a wait that ends by itself); it
 *                             runs on a thread of its own, which tells the loop nothing
 *                             else (as the proxy's request threads): only the wire
 *                             server's own completion can wake the loop; with `pad: N`
 *                             (0..12000000) the reply also carries pad: a string of N
 *                             'x' (a reply larger than the socket buffers)
 *   {insert: "coll", documents: [...]} (documents usually as an OP_MSG kind-1 sequence)
 *                             reply {n: count of documents}; nothing is stored
 *   {stripedbTestEcho: 1, ...} reply {cmd: <the command document as the handler saw it>}
 * SIGTERM or SIGINT -> wire_server_close (drain, 5 s by default) -> exit 0 when the loop closed
 * cleanly with no handle left, 1 otherwise. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/http.h"
#include "common/log.h"
#include "wire/server.h"

typedef struct work {
	wire_req *req;
	int64_t ms;
	int64_t pad;  /* bytes of the reply's pad string */
	bool waiting; /* bracket the sleep as a wait (wire_req_wait_begin) */
} work;

static uv_signal_t sig_term, sig_int;
static wire_server *srv;
static sdb_http *http;
static uint64_t close_timeout_ms = 5000;

static int health(void *data, char *msg, size_t msglen)
{
	(void)data;
	(void)msg;
	(void)msglen;
	return 1;
}

static void *sleep_thread(void *arg)
{
	work *k = arg;
	sdb_info("stripedbTestSleep started", "ms=%lld", (long long)k->ms); /* tests wait for it */
	if (k->waiting)
		wire_req_wait_begin(k->req);
	uv_sleep((unsigned)k->ms);
	if (k->waiting)
		wire_req_wait_end(k->req);
	/* completed from this thread, as a role with blocking work would */
	bson_t *reply = BCON_NEW("slept", BCON_INT64(k->ms));
	if (k->pad > 0) {
		char *pad = sdb_malloc((size_t)k->pad + 1);
		memset(pad, 'x', (size_t)k->pad);
		pad[k->pad] = '\0';
		BSON_APPEND_UTF8(reply, "pad", pad);
		free(pad);
	}
	wire_req_reply(k->req, reply);
	free(k);
	return NULL;
}

static void cmd_sleep(wire_req *req, void *data)
{
	bson_iter_t it;
	work *k;

	(void)data;
	if (!bson_iter_init_find(&it, wire_req_cmd(req), "stripedbTestSleep") ||
	    !BSON_ITER_HOLDS_NUMBER(&it) || bson_iter_as_int64(&it) < 0 ||
	    bson_iter_as_int64(&it) > 10000) {
		wire_req_error(req, 2, "stripedbTestSleep takes a number of ms in 0..10000");
		return;
	}
	k = sdb_calloc(1, sizeof *k);
	k->req = req;
	k->ms = bson_iter_as_int64(&it);
	k->waiting = bson_iter_init_find(&it, wire_req_cmd(req), "waiting") &&
		     bson_iter_as_bool(&it);
	if (bson_iter_init_find(&it, wire_req_cmd(req), "pad") && BSON_ITER_HOLDS_NUMBER(&it) &&
	    bson_iter_as_int64(&it) > 0 && bson_iter_as_int64(&it) <= 12000000)
		k->pad = bson_iter_as_int64(&it);
	pthread_t t;
	if (pthread_create(&t, NULL, sleep_thread, k) != 0) {
		free(k);
		wire_req_error(req, 1, "pthread_create failed");
		return;
	}
	pthread_detach(t);
}

static void cmd_insert(wire_req *req, void *data)
{
	bson_iter_t it, arr;
	int32_t n = 0;

	(void)data;
	if (!bson_iter_init_find(&it, wire_req_cmd(req), "documents") ||
	    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr)) {
		wire_req_error(req, 9, "insert needs a documents array");
		return;
	}
	while (bson_iter_next(&arr))
		n++;
	wire_req_reply(req, BCON_NEW("n", BCON_INT32(n)));
}

static void cmd_echo(wire_req *req, void *data)
{
	bson_t *reply = bson_new();

	(void)data;
	BSON_APPEND_DOCUMENT(reply, "cmd", wire_req_cmd(req));
	BSON_APPEND_UTF8(reply, "db", wire_req_db(req));
	wire_req_reply(req, reply);
}

static void on_closed(void *arg)
{
	(void)arg;
	uv_close((uv_handle_t *)&sig_term, NULL);
	uv_close((uv_handle_t *)&sig_int, NULL);
}

static void on_signal(uv_signal_t *s, int signum)
{
	(void)s;
	(void)signum;
	uv_signal_stop(&sig_term);
	uv_signal_stop(&sig_int);
	wire_server_close(srv, close_timeout_ms, on_closed, NULL);
}

int main(int argc, char **argv)
{
	const char *listen = NULL, *http_listen = NULL;
	uv_loop_t *loop = uv_default_loop();
	wire_server_opts opts = {0};
	char err[256];
	int rc;

	sdb_alloc_init();
	signal(SIGPIPE, SIG_IGN); /* a client's reset meets a write: an error, not a kill (as
				   * common/role.c does for the roles) */
	for (int i = 1; i < argc; i++) {
		if (strncmp(argv[i], "--listen=", 9) == 0)
			listen = argv[i] + 9;
		else if (strncmp(argv[i], "--http-listen=", 14) == 0)
			http_listen = argv[i] + 14;
		else if (strncmp(argv[i], "--close-timeout-ms=", 19) == 0)
			close_timeout_ms = strtoull(argv[i] + 19, NULL, 10);
		else if (strcmp(argv[i], "--debug") == 0)
			sdb_log_set_level(SDB_LOG_DEBUG);
	}
	if (!listen) {
		fprintf(stderr, "usage: wire_test_server --listen=HOST:PORT [--debug]\n");
		return 2;
	}
	sdb_log_set_thread("wiretest", NULL);
	opts.listen = listen;
	opts.role = "wiretest";
	rc = wire_server_new(loop, &opts, &srv, err, sizeof err);
	if (rc != 0) {
		fprintf(stderr, "wire_test_server: %s\n", err);
		uv_run(loop, UV_RUN_DEFAULT);
		uv_loop_close(loop);
		return 1;
	}
	wire_server_register(srv, "stripedbTestSleep", cmd_sleep);
	wire_server_register(srv, "insert", cmd_insert);
	wire_server_register(srv, "stripedbTestEcho", cmd_echo);
	if (http_listen) {
		rc = sdb_http_acquire(http_listen, &http, err, sizeof err);
		if (rc != 0) {
			fprintf(stderr, "wire_test_server: %s\n", err);
			return 1;
		}
		sdb_http_add_health(http, "wire", health, NULL);
	}
	uv_signal_init(loop, &sig_term);
	uv_signal_init(loop, &sig_int);
	uv_signal_start(&sig_term, on_signal, SIGTERM);
	uv_signal_start(&sig_int, on_signal, SIGINT);
	printf("port=%d\n", wire_server_port(srv));
	fflush(stdout);
	uv_run(loop, UV_RUN_DEFAULT);
	if (http)
		sdb_http_release(http);
	rc = uv_loop_close(loop);
	if (rc != 0) {
		fprintf(stderr, "wire_test_server: loop not closed cleanly: %s\n", uv_strerror(rc));
		return 1;
	}
	return 0;
}
