/* The shared commands every wire role answers: enough of mongod's handshake and
 * introspection commands for pymongo, the Node.js driver, libmongoc and mongosh.
 * Sources: MongoDB's hello (src/mongo/db/repl/replication_info.cpp, the awaitable hello of
 * the SDAM spec "server-monitoring.md"), buildInfo, getParameter, getLog, whatsmyuri,
 * hostInfo, connectionStatus, endSessions and killAllSessions reference pages. And the
 * command table itself (wire_server_register, the lookup, per-command metrics). */
#ifdef HAVE_CONFIG_H
#include "build_config.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/cmdopts.h"
#include "common/alloc.h"
#include "common/log.h"
#include "wire/internal.h"
#include "wire/msg.h"
#include "wire/topology.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif
#ifndef SDB_GIT_VERSION
#define SDB_GIT_VERSION "unknown"
#endif

#define WIRE_COMPAT_VERSION "6.0.0"
#define WIRE_LOGICAL_SESSION_TIMEOUT_MIN 30
/* Upper bound for an awaitable hello's wait, whatever maxAwaitTimeMS says. */
#define WIRE_MAX_AWAIT_MS (10 * 60 * 1000)

/* ---- hello / isMaster ---- */

struct wire_hello_wait {
	uv_timer_t timer;
	wire_server *srv;
	wire_req *req;
	wire_hello_wait *prev, *next;
};

static bson_t *hello_build(wire_server *srv, wire_req *req);

void wire__append_topology_version(const wire_server *srv, bson_t *doc)
{
	bson_t tv;

	BSON_APPEND_DOCUMENT_BEGIN(doc, "topologyVersion", &tv);
	BSON_APPEND_OID(&tv, "processId", &srv->process_id);
	BSON_APPEND_INT64(&tv, "counter", srv->topology_counter);
	bson_append_document_end(doc, &tv);
}

/* Answer hello while the server is closing (quiesce mode): ShutdownInProgress with the
 * bumped topologyVersion, as mongod/mongos 5.0+ do, so monitors mark the server Unknown
 * and drivers select another one. */
static void hello_shutdown(wire_server *srv, wire_req *req)
{
	bson_t *extra = bson_new();

	wire__append_topology_version(srv, extra);
	wire_req_error_extra(req, WIRE_ERR_SHUTDOWN_IN_PROGRESS, extra,
			     "The server is in quiesce mode and will shut down");
}

static void on_hello_timer_closed(uv_handle_t *h)
{
	free(h->data);
}

/* Reply to a waiting hello now and release its timer (loop thread). */
static void hello_wait_finish(wire_hello_wait *w)
{
	wire_server *srv = w->srv;

	if (w->prev)
		w->prev->next = w->next;
	else
		srv->hello_waits = w->next;
	if (w->next)
		w->next->prev = w->prev;
	uv_timer_stop(&w->timer);
	if (wire_req_conn(w->req)->state == WIRE_CONN_CLOSING)
		wire_req_reply(w->req, NULL); /* nobody to answer */
	else if (srv->state != WIRE_SRV_RUNNING)
		hello_shutdown(srv, w->req);
	else
		wire_req_reply(w->req, hello_build(srv, w->req));
	uv_close((uv_handle_t *)&w->timer, on_hello_timer_closed);
}

static void on_hello_timer(uv_timer_t *t)
{
	hello_wait_finish(t->data);
}

void wire__hello_cancel_conn(wire_server *srv, wire_conn *conn)
{
	wire_hello_wait *w = srv->hello_waits, *next;

	for (; w; w = next) {
		next = w->next;
		if (wire_req_conn(w->req) == conn)
			hello_wait_finish(w);
	}
}

void wire__hello_flush(wire_server *srv)
{
	while (srv->hello_waits)
		hello_wait_finish(srv->hello_waits);
}

/* An awaitable hello (SDAM streaming protocol) carries the topologyVersion the client
 * already knows and maxAwaitTimeMS: when that version is still ours, mongod waits until
 * the topology changes or the time is up. stripedb's topology of one server does not
 * change by itself, so the reply comes after maxAwaitTimeMS, at shutdown, or when the role
 * calls wire_server_topology_changed(). Without this wait a
 * streaming driver (pymongo, Node.js) would re-send hello in a tight loop. Returns the
 * wait in ms, or -1 to answer at once. */
static int64_t hello_await_ms(const wire_server *srv, const bson_t *cmd)
{
	bson_iter_t it, tv;
	int64_t ms;

	if (!bson_iter_init_find(&it, cmd, "maxAwaitTimeMS") || !BSON_ITER_HOLDS_NUMBER(&it))
		return -1;
	ms = bson_iter_as_int64(&it);
	if (ms < 0)
		return -1;
	if (!bson_iter_init_find(&it, cmd, "topologyVersion") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &tv))
		return -1;
	if (!bson_iter_find(&tv, "processId") || !BSON_ITER_HOLDS_OID(&tv) ||
	    !bson_oid_equal(bson_iter_oid(&tv), &srv->process_id))
		return -1;
	if (!bson_iter_recurse(&it, &tv) || !bson_iter_find(&tv, "counter") ||
	    !BSON_ITER_HOLDS_NUMBER(&tv) || bson_iter_as_int64(&tv) != srv->topology_counter)
		return -1;
	return ms > WIRE_MAX_AWAIT_MS ? WIRE_MAX_AWAIT_MS : ms;
}

/* The hello reply, built when it is sent (an awaitable hello reports the state at the end
 * of its wait, not at its start). */
static bson_t *hello_build(wire_server *srv, wire_req *req)
{
	const bson_t *cmd = wire_req_cmd(req);
	const char *name = wire_req_name(req);
	bool legacy = strcmp(name, "hello") != 0; /* isMaster / ismaster */
	bson_t *reply = bson_new();
	bson_t tv;

	BSON_APPEND_BOOL(reply, "helloOk", true);
	BSON_APPEND_BOOL(reply, legacy ? "ismaster" : "isWritablePrimary", true);
	BSON_APPEND_DOCUMENT_BEGIN(reply, "topologyVersion", &tv);
	BSON_APPEND_OID(&tv, "processId", &srv->process_id);
	BSON_APPEND_INT64(&tv, "counter", srv->topology_counter);
	bson_append_document_end(reply, &tv);
	BSON_APPEND_INT32(reply, "maxBsonObjectSize", WIRE_MAX_BSON_SIZE);
	BSON_APPEND_INT32(reply, "maxMessageSizeBytes", WIRE_MAX_MESSAGE_SIZE);
	BSON_APPEND_INT32(reply, "maxWriteBatchSize", WIRE_MAX_WRITE_BATCH);
	/* localTime is wall-clock by protocol (a BSON date). */
	bson_append_now_utc(reply, "localTime", -1);
	BSON_APPEND_INT32(reply, "logicalSessionTimeoutMinutes", WIRE_LOGICAL_SESSION_TIMEOUT_MIN);
	BSON_APPEND_INT64(reply, "connectionId", wire_conn_id(wire_req_conn(req)));
	BSON_APPEND_INT32(reply, "minWireVersion", WIRE_MIN_WIRE_VERSION);
	BSON_APPEND_INT32(reply, "maxWireVersion", WIRE_MAX_WIRE_VERSION);
	BSON_APPEND_BOOL(reply, "readOnly", false);
	if (srv->is_mongos)
		BSON_APPEND_UTF8(reply, "msg", "isdbgrid");
	if (srv->hello)
		srv->hello(srv->role_data, cmd, reply);
	return reply;
}

static void cmd_hello(wire_req *req, void *role_data)
{
	wire_server *srv = req->srv;
	int64_t wait_ms;

	(void)role_data;
	if (srv->state != WIRE_SRV_RUNNING) {
		hello_shutdown(srv, req);
		return;
	}
	wait_ms = hello_await_ms(srv, wire_req_cmd(req));
	if (wait_ms > 0 && srv->state == WIRE_SRV_RUNNING) {
		wire_hello_wait *w = sdb_calloc(1, sizeof *w);
		w->srv = srv;
		w->req = req;
		uv_timer_init(srv->loop, &w->timer);
		w->timer.data = w;
		w->next = srv->hello_waits;
		if (w->next)
			w->next->prev = w;
		srv->hello_waits = w;
		uv_timer_start(&w->timer, on_hello_timer, (uint64_t)wait_ms, 0);
		/* notice a driver closing its monitoring connection during the wait */
		wire__conn_watch_eof(wire_req_conn(req));
		return;
	}
	wire_req_reply(req, hello_build(srv, req));
}

void wire_server_topology_changed(wire_server *srv)
{
	srv->topology_counter++;
	wire__hello_flush(srv);
}

/* ---- simple commands ---- */

static void cmd_ping(wire_req *req, void *role_data)
{
	(void)role_data;
	wire_req_reply(req, bson_new());
}

static void cmd_build_info(wire_req *req, void *role_data)
{
	bson_t *reply = bson_new();
	bson_t arr, child;

	(void)role_data;
	BSON_APPEND_UTF8(reply, "version", WIRE_COMPAT_VERSION "-stripedb-" PACKAGE_VERSION);
	BSON_APPEND_UTF8(reply, "gitVersion", SDB_GIT_VERSION);
	BSON_APPEND_ARRAY_BEGIN(reply, "versionArray", &arr);
	BSON_APPEND_INT32(&arr, "0", 6);
	BSON_APPEND_INT32(&arr, "1", 0);
	BSON_APPEND_INT32(&arr, "2", 0);
	BSON_APPEND_INT32(&arr, "3", 0);
	bson_append_array_end(reply, &arr);
	BSON_APPEND_UTF8(reply, "stripedbVersion", PACKAGE_VERSION);
	BSON_APPEND_ARRAY_BEGIN(reply, "modules", &arr);
	bson_append_array_end(reply, &arr);
	BSON_APPEND_UTF8(reply, "allocator", "system");
	BSON_APPEND_UTF8(reply, "javascriptEngine", "none");
	BSON_APPEND_UTF8(reply, "sysInfo", "deprecated");
	BSON_APPEND_DOCUMENT_BEGIN(reply, "openssl", &child);
	BSON_APPEND_UTF8(&child, "running", "disabled");
	bson_append_document_end(reply, &child);
	BSON_APPEND_DOCUMENT_BEGIN(reply, "buildEnvironment", &child);
	bson_append_document_end(reply, &child);
	BSON_APPEND_INT32(reply, "bits", (int32_t)(sizeof(void *) * 8));
	BSON_APPEND_BOOL(reply, "debug", false);
	BSON_APPEND_INT32(reply, "maxBsonObjectSize", WIRE_MAX_BSON_SIZE);
	BSON_APPEND_ARRAY_BEGIN(reply, "storageEngines", &arr);
	BSON_APPEND_UTF8(&arr, "0", "stripedb");
	bson_append_array_end(reply, &arr);
	wire_req_reply(req, reply);
}

static void append_param(bson_t *reply, const char *name)
{
	if (strcmp(name, "featureCompatibilityVersion") == 0) {
		bson_t child;
		BSON_APPEND_DOCUMENT_BEGIN(reply, "featureCompatibilityVersion", &child);
		BSON_APPEND_UTF8(&child, "version", "6.0");
		bson_append_document_end(reply, &child);
	}
}

static const char *const known_params[] = {"featureCompatibilityVersion", NULL};

static void cmd_get_parameter(wire_req *req, void *role_data)
{
	const bson_t *cmd = wire_req_cmd(req);
	bson_t *reply = bson_new();
	bson_iter_t it;
	bool all = false;
	int found = 0;

	(void)role_data;
	if (bson_iter_init_find(&it, cmd, "getParameter") && BSON_ITER_HOLDS_UTF8(&it) &&
	    strcmp(bson_iter_utf8(&it, NULL), "*") == 0)
		all = true;
	for (size_t i = 0; known_params[i]; i++) {
		if (all || (bson_iter_init_find(&it, cmd, known_params[i]))) {
			append_param(reply, known_params[i]);
			found++;
		}
	}
	if (found == 0) {
		bson_destroy(reply);
		wire_req_error(req, WIRE_ERR_INVALID_OPTIONS, "no option found to get");
		return;
	}
	wire_req_reply(req, reply);
}

static void cmd_get_log(wire_req *req, void *role_data)
{
	const bson_t *cmd = wire_req_cmd(req);
	bson_t *reply;
	bson_t arr;
	bson_iter_t it;
	const char *what;

	(void)role_data;
	if (!bson_iter_init_find(&it, cmd, "getLog") || !BSON_ITER_HOLDS_UTF8(&it)) {
		wire_req_error(req, WIRE_ERR_TYPE_MISMATCH,
			       "Argument to getLog must be of type String");
		return;
	}
	what = bson_iter_utf8(&it, NULL);
	reply = bson_new();
	if (strcmp(what, "*") == 0) {
		BSON_APPEND_ARRAY_BEGIN(reply, "names", &arr);
		BSON_APPEND_UTF8(&arr, "0", "global");
		BSON_APPEND_UTF8(&arr, "1", "startupWarnings");
		bson_append_array_end(reply, &arr);
	} else if (strcmp(what, "global") == 0 || strcmp(what, "startupWarnings") == 0) {
		BSON_APPEND_INT32(reply, "totalLinesWritten", 0);
		BSON_APPEND_ARRAY_BEGIN(reply, "log", &arr);
		bson_append_array_end(reply, &arr);
	} else {
		bson_destroy(reply);
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "No log named '%.100s'", what);
		return;
	}
	wire_req_reply(req, reply);
}

static void cmd_whatsmyuri(wire_req *req, void *role_data)
{
	bson_t *reply = bson_new();

	(void)role_data;
	BSON_APPEND_UTF8(reply, "you", wire_conn_peer(wire_req_conn(req)));
	wire_req_reply(req, reply);
}

static void cmd_host_info(wire_req *req, void *role_data)
{
	bson_t *reply = bson_new();
	bson_t sys, os, extra;
	char hostname[256];
	size_t hlen = sizeof hostname;
	uv_utsname_t uts;
	bool have_uts = uv_os_uname(&uts) == 0;

	(void)role_data;
	if (uv_os_gethostname(hostname, &hlen) != 0)
		snprintf(hostname, sizeof hostname, "localhost");
	BSON_APPEND_DOCUMENT_BEGIN(reply, "system", &sys);
	bson_append_now_utc(&sys, "currentTime", -1);
	BSON_APPEND_UTF8(&sys, "hostname", hostname);
	BSON_APPEND_INT32(&sys, "cpuAddrSize", (int32_t)(sizeof(void *) * 8));
	BSON_APPEND_INT64(&sys, "memSizeMB", (int64_t)(uv_get_total_memory() / (1024 * 1024)));
	BSON_APPEND_INT32(&sys, "numCores", (int32_t)uv_available_parallelism());
	BSON_APPEND_UTF8(&sys, "cpuArch", have_uts ? uts.machine : "unknown");
	BSON_APPEND_BOOL(&sys, "numaEnabled", false);
	bson_append_document_end(reply, &sys);
	BSON_APPEND_DOCUMENT_BEGIN(reply, "os", &os);
	BSON_APPEND_UTF8(&os, "type", have_uts ? uts.sysname : "unknown");
	BSON_APPEND_UTF8(&os, "name", have_uts ? uts.sysname : "unknown");
	BSON_APPEND_UTF8(&os, "version", have_uts ? uts.release : "unknown");
	bson_append_document_end(reply, &os);
	BSON_APPEND_DOCUMENT_BEGIN(reply, "extra", &extra);
	bson_append_document_end(reply, &extra);
	wire_req_reply(req, reply);
}

static void cmd_connection_status(wire_req *req, void *role_data)
{
	const bson_t *cmd = wire_req_cmd(req);
	bson_t *reply = bson_new();
	bson_t auth, arr;
	bson_iter_t it;

	(void)role_data;
	BSON_APPEND_DOCUMENT_BEGIN(reply, "authInfo", &auth);
	BSON_APPEND_ARRAY_BEGIN(&auth, "authenticatedUsers", &arr);
	bson_append_array_end(&auth, &arr);
	BSON_APPEND_ARRAY_BEGIN(&auth, "authenticatedUserRoles", &arr);
	bson_append_array_end(&auth, &arr);
	if (bson_iter_init_find(&it, cmd, "showPrivileges") && bson_iter_as_bool(&it)) {
		BSON_APPEND_ARRAY_BEGIN(&auth, "authenticatedUserPrivileges", &arr);
		bson_append_array_end(&auth, &arr);
	}
	bson_append_document_end(reply, &auth);
	wire_req_reply(req, reply);
}

/* endSessions / killAllSessions: stripedb keeps no server-side session state in the shared
 * layer, so there is nothing to end (roles with sessions register their own). */
static uint64_t process_start_ns; /* set once by the first wire__register_builtins */
static uv_once_t process_start_once = UV_ONCE_INIT;

static void process_start_init(void)
{
	process_start_ns = sdb_mono_ns();
}

/* Virtual memory size in bytes from /proc/self/statm, or 0 when unknown. */
static uint64_t virtual_bytes(void)
{
	unsigned long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f == NULL)
		return 0;
	if (fscanf(f, "%lu", &pages) != 1)
		pages = 0;
	fclose(f);
	return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int64_t cmd_count(const wire_server *srv, const char *name)
{
	for (size_t i = 0; i < srv->n_cmds; i++)
		if (strcmp(srv->cmds[i]->name, name) == 0)
			return (int64_t)(sdb_counter_value(srv->cmds[i]->ok) +
					 sdb_counter_value(srv->cmds[i]->error));
	return 0;
}

/* serverStatus (MongoDB's command, the part monitoring tools read): host, version,
 * process ("mongos" on the proxy, else "mongod"), pid, uptime (s), uptimeMillis,
 * localTime, connections {current, available}, opcounters {insert, query, update, delete,
 * getmore, command} counted since start by this listener's role, mem {bits, resident,
 * virtual} (MiB), ok. */
static void cmd_server_status(wire_req *req, void *role_data)
{
	wire_server *srv = req->srv;
	bson_t *reply = bson_new();
	bson_t sub;
	char hostname[256], host[300];
	size_t hlen = sizeof hostname, rss = 0;
	int64_t up_ms = (int64_t)((sdb_mono_ns() - process_start_ns) / 1000000);
	int64_t all = 0, named;
	static const char *const named_cmds[][2] = {
		{"insert", "insert"}, {"find", "query"}, {"update", "update"},
		{"delete", "delete"}, {"getMore", "getmore"},
	};

	(void)role_data;
	if (uv_os_gethostname(hostname, &hlen) != 0)
		snprintf(hostname, sizeof hostname, "localhost");
	snprintf(host, sizeof host, "%s:%d", hostname, srv->port);
	BSON_APPEND_UTF8(reply, "host", host);
	BSON_APPEND_UTF8(reply, "version", WIRE_COMPAT_VERSION "-stripedb-" PACKAGE_VERSION);
	BSON_APPEND_UTF8(reply, "process", srv->is_mongos ? "mongos" : "mongod");
	BSON_APPEND_INT64(reply, "pid", (int64_t)uv_os_getpid());
	/* whole seconds, as mongod (NOLINTNEXTLINE(bugprone-integer-division)) */
	BSON_APPEND_DOUBLE(reply, "uptime", (double)(up_ms / 1000));
	BSON_APPEND_INT64(reply, "uptimeMillis", up_ms);
	BSON_APPEND_INT64(reply, "uptimeEstimate", up_ms / 1000);
	bson_append_now_utc(reply, "localTime", -1);
	BSON_APPEND_DOCUMENT_BEGIN(reply, "connections", &sub);
	BSON_APPEND_INT32(&sub, "current", (int32_t)srv->n_conns);
	BSON_APPEND_INT32(&sub, "available",
			  srv->max_connections > 0
				  ? (int32_t)(srv->max_connections - (int)srv->n_conns)
				  : 838860 - (int32_t)srv->n_conns);
	bson_append_document_end(reply, &sub);
	for (size_t i = 0; i < srv->n_cmds; i++)
		all += (int64_t)(sdb_counter_value(srv->cmds[i]->ok) +
				 sdb_counter_value(srv->cmds[i]->error));
	BSON_APPEND_DOCUMENT_BEGIN(reply, "opcounters", &sub);
	named = 0;
	for (size_t i = 0; i < sizeof named_cmds / sizeof named_cmds[0]; i++) {
		int64_t n = cmd_count(srv, named_cmds[i][0]);
		named += n;
		BSON_APPEND_INT64(&sub, named_cmds[i][1], n);
	}
	BSON_APPEND_INT64(&sub, "command", all - named);
	bson_append_document_end(reply, &sub);
	uv_resident_set_memory(&rss);
	BSON_APPEND_DOCUMENT_BEGIN(reply, "mem", &sub);
	BSON_APPEND_INT32(&sub, "bits", (int32_t)(sizeof(void *) * 8));
	BSON_APPEND_INT64(&sub, "resident", (int64_t)(rss / (1024 * 1024)));
	BSON_APPEND_INT64(&sub, "virtual", (int64_t)(virtual_bytes() / (1024 * 1024)));
	BSON_APPEND_BOOL(&sub, "supported", true);
	bson_append_document_end(reply, &sub);
	wire_req_reply(req, reply);
}

static void cmd_ok(wire_req *req, void *role_data)
{
	(void)role_data;
	wire_req_reply(req, bson_new());
}

/* The built-in commands that never write: a writeConcern on one is refused (72, as mongod:
 * common/cmdopts.h sdb_cmd_write_concern_check) before it runs. */
static const struct {
	const char *name;
	wire_cmd_fn fn;
} read_builtins[] = {
	{"hello", cmd_hello},
	{"ping", cmd_ping},
	{"buildInfo", cmd_build_info},
	{"buildinfo", cmd_build_info},
	{"getParameter", cmd_get_parameter},
	{"getLog", cmd_get_log},
	{"whatsmyuri", cmd_whatsmyuri},
	{"hostInfo", cmd_host_info},
	{"connectionStatus", cmd_connection_status},
	{"serverStatus", cmd_server_status},
};

/* Dispatches a read_builtins command by its name (the command's first field). */
static void cmd_read_builtin(wire_req *req, void *role_data)
{
	const bson_t *cmd = wire_req_cmd(req);
	bson_iter_t it;
	const char *name = bson_iter_init(&it, cmd) && bson_iter_next(&it) ? bson_iter_key(&it) : "";
	char err[128];
	int code;

	for (size_t i = 0; i < sizeof read_builtins / sizeof read_builtins[0]; i++) {
		if (strcmp(read_builtins[i].name, wire__canonical_name(name)) != 0)
			continue;
		if ((code = sdb_cmd_write_concern_check(name, cmd, err, sizeof err)) != 0) {
			wire_req_error(req, code, "%s", err);
			return;
		}
		read_builtins[i].fn(req, role_data);
		return;
	}
	wire_req_error(req, WIRE_ERR_COMMAND_NOT_FOUND, "no such command: '%s'", name);
}

void wire__register_builtins(wire_server *srv)
{
	for (size_t i = 0; i < sizeof read_builtins / sizeof read_builtins[0]; i++)
		wire_server_register(srv, read_builtins[i].name, cmd_read_builtin);
	wire_server_register(srv, "endSessions", cmd_ok);
	wire_server_register(srv, "killAllSessions", cmd_ok);
	wire_server_register(srv, "configureFailPoint", wire__cmd_configure_fail_point);
	uv_once(&process_start_once, process_start_init);
}

/* ---- the command table: registration, lookup, per-command metrics ---- */

/* A command's series: its labels are role="R",cmd="C" and then the row's. */
static const sdb_metric_def entry_metrics[] = {
	SDB_METRIC_COUNTER_L(wire_cmd_entry, ok, "stripedb_wire_commands_total",
			     "Wire protocol commands completed, by command and status.",
			     "status=\"ok\""),
	SDB_METRIC_COUNTER_L(wire_cmd_entry, error, "stripedb_wire_commands_total",
			     "Wire protocol commands completed, by command and status.",
			     "status=\"error\""),
	SDB_METRIC_HISTOGRAM(wire_cmd_entry, duration, "stripedb_wire_command_duration_seconds",
			     "Wire protocol command latency, receive to the reply (completion)."),
};

void wire__entry_init_metrics(wire_server *srv, wire_cmd_entry *e, const char *cmd)
{
	char labels[256];

	snprintf(labels, sizeof labels, "role=\"%s\",cmd=\"%s\"", srv->role, cmd);
	SDB_METRICS_REGISTER(e, entry_metrics, labels);
}

const char *wire__canonical_name(const char *name)
{
	if (strcmp(name, "isMaster") == 0 || strcmp(name, "ismaster") == 0)
		return "hello";
	return name;
}

wire_cmd_entry *wire__lookup(wire_server *srv, const char *name)
{
	name = wire__canonical_name(name);
	for (size_t i = 0; i < srv->n_cmds; i++)
		if (strcmp(srv->cmds[i]->name, name) == 0)
			return srv->cmds[i];
	return NULL;
}

static void refuse_js(wire_req *req, void *data)
{
	(void)data;
	wire_req_error(req, WIRE_ERR_COMMAND_NOT_FOUND,
		       "%s is not supported: server-side JavaScript is never accepted by stripedb",
		       wire_req_name(req));
}

void wire_server_refuse_js(wire_server *srv)
{
	static const char *const js[] = {"mapReduce", "mapreduce", "eval", "$eval", "group"};

	for (size_t i = 0; i < sizeof js / sizeof js[0]; i++)
		wire_server_register(srv, js[i], refuse_js);
}

void wire_server_register(wire_server *srv, const char *name, wire_cmd_fn fn)
{
	wire_cmd_entry *e;

	name = wire__canonical_name(name);
	e = wire__lookup(srv, name);
	if (!e) {
		if (srv->n_cmds == srv->cap_cmds) {
			srv->cap_cmds = srv->cap_cmds ? srv->cap_cmds * 2 : 32;
			srv->cmds = sdb_realloc(srv->cmds, srv->cap_cmds * sizeof *srv->cmds);
		}
		e = sdb_calloc(1, sizeof *e);
		srv->cmds[srv->n_cmds++] = e;
		e->name = sdb_strdup(name);
		wire__entry_init_metrics(srv, e, name);
	}
	e->fn = fn;
}
