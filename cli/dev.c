/* `stripedb dev`: a complete local cluster for laptops, demos and tests.
 *
 *   stripedb dev up [--dir DIR] [--shards N] [--shard-members 1|3|5] [--proxies N]
 *                   [--coordinators N] [--cdc embedded|kafka] [--log-level L]
 *   stripedb dev status [--dir DIR] [--json]
 *   stripedb dev down [--dir DIR]
 *   stripedb dev kill NAME|ROLE|SHARD [--dir DIR] SIGKILL (ROLE "metadata" = the leader;
 *                                                  SHARD, e.g. shard-a = its primary)
 *   stripedb dev restart NAME [--dir DIR]
 *   stripedb dev kafka-mock --out FILE TOPIC...   (internal: a Kafka-protocol broker, librdkafka's
 *                                                  mock cluster, for --cdc kafka)
 *
 * `up` starts every role as a child process of its own (metadata x3, N shards of
 * --shard-members replica-set members each (default 3: shard-a-1..3, a Raft group named
 * shard-a; with 1 the member is named shard-a), proxies, coordinators, one rate limiter) in their own session, logs under DIR/logs/, data under
 * DIR/data/, and records the cluster in DIR/cluster.json (names, roles, pids, ports, argv),
 * which the other subcommands read. Every port is chosen free at `up` time by binding port 0
 * on 127.0.0.1, so two clusters on one machine never clash. `up` returns once every process
 * answers /healthz, every shard set has a primary and the shards are registered with the
 * metadata service by their replica-set URIs (mongodb://h1,h2,h3/?replicaSet=shard-a). `up` in a DIR
 * whose cluster was stopped resumes it with its recorded arguments (dev_resume).
 *
 * Exit codes: 0 ok, 1 a process failed to start or the cluster misbehaved, 2 bad usage.
 */
#include "cli/cli.h"
#include "cli/dev.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <limits.h>
#include <mongoc/mongoc.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/metauri.h"
#include "common/clock.h"
#include "raft/migstate.h"

#define DEV_START_TIMEOUT_MS 60000


/* Reserve a free loopback port: the socket stays bound (and so the port reserved against
 * the other allocations of this `up`) until dev_release_ports(). */
static int reserved_fds[DEV_MAX_PROCS * 4];
static int n_reserved;

/* The lowest port of the kernel's ephemeral range (outgoing connections take theirs from
 * it), 32768 when unknown. */
static int ephemeral_low(void)
{
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	int lo = 32768, hi = 0;

	if (f != NULL) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2 || lo < 2048) {
			lo = 32768;
		}
		fclose(f);
	}
	return lo;
}

/* STRIPEDB_DEV_PORT_RANGE=LO-HI: take ports from [LO, HI) instead (1024 <= LO, LO + 100 <=
 * HI <= 65536), so that processes sharing a machine can keep to disjoint ranges (the
 * parallel integration suite gives each worker its own, tests/integration/conftest.py).
 * False when unset or malformed (the default range is used). */
static bool env_port_range(int *lo, int *hi)
{
	const char *v = getenv("STRIPEDB_DEV_PORT_RANGE");
	int a, b, n = 0;

	if (v == NULL || sscanf(v, "%d-%d%n", &a, &b, &n) != 2 || v[n] != '\0' || a < 1024 ||
	    b > 65536 || b - a < 100)
		return false;
	*lo = a;
	*hi = b;
	return true;
}

/* Ports are taken below the ephemeral range: a port reserved here is released before the
 * processes start, and the Raft connections between members (outgoing, ephemeral ports)
 * must not take a listen port of a process that starts later. Falls back to the kernel's
 * choice (port 0) when no such port is free. */
static int reserve_port(void)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int base = 10000, lo = ephemeral_low();

	if (!env_port_range(&base, &lo) && lo <= 12000)
		lo = base; /* no room below the ephemeral range: the kernel's choice */
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; fd >= 0 && lo > base && i < 200; i++) {
		int port = base + (int)((unsigned)rand() % (unsigned)(lo - base));
		a.sin_port = htons((uint16_t)port);
		if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0) {
			reserved_fds[n_reserved++] = fd;
			return port;
		}
	}
	a.sin_port = 0;
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
		fprintf(stderr, "stripedb dev: cannot reserve a loopback port: %s\n", strerror(errno));
		exit(1);
	}
	reserved_fds[n_reserved++] = fd;
	return ntohs(a.sin_port);
}

static void release_ports(void)
{
	for (int i = 0; i < n_reserved; i++) {
		close(reserved_fds[i]);
	}
	n_reserved = 0;
}

static void proc_arg(dev_proc *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void proc_arg(dev_proc *p, const char *fmt, ...)
{
	va_list ap;
	char buf[1024];

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (p->argc + 1 >= DEV_MAX_ARGS) {
		fprintf(stderr, "stripedb dev: too many arguments for %s\n", p->name);
		exit(1);
	}
	p->argv[p->argc++] = sdb_strdup(buf);
	p->argv[p->argc] = NULL;
}

static void self_exe(char *buf, size_t n)
{
	ssize_t len = readlink("/proc/self/exe", buf, n - 1);

	if (len <= 0) {
		snprintf(buf, n, "stripedb");
		return;
	}
	buf[len] = '\0';
}

static int spawn(dev_cluster *c, dev_proc *p)
{
	char log[PATH_MAX + 64];
	char exe[PATH_MAX];
	int fd;
	pid_t pid;

	self_exe(exe, sizeof exe);
	snprintf(log, sizeof log, "%s/logs/%s.log", c->dir, p->name);
	fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "stripedb dev: cannot open %s: %s\n", log, strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "stripedb dev: fork: %s\n", strerror(errno));
		close(fd);
		return -1;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		setsid();
		dup2(null, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		setenv("STRIPEDB_CONFIG", "/dev/null", 1);
		execv(exe, p->argv);
		fprintf(stderr, "stripedb dev: exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(fd);
	p->pid = (int)pid;
	return 0;
}

/* An HTTP GET with libcurl; returns the status code or 0 when unreachable. */
static long http_status(int port, const char *path)
{
	char url[128];
	CURL *h = curl_easy_init();
	long code = 0;
	FILE *sink = fopen("/dev/null", "w");

	if (h == NULL) {
		if (sink != NULL) {
			fclose(sink);
		}
		return 0;
	}
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, sink);
	if (curl_easy_perform(h) == CURLE_OK) {
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
	}
	curl_easy_cleanup(h);
	if (sink != NULL) {
		fclose(sink);
	}
	return code;
}

static void strip_deleted(char *path)
{
	static const char suffix[] = " (deleted)";
	size_t n = strlen(path), k = sizeof suffix - 1;

	if (n > k && strcmp(path + n - k, suffix) == 0) {
		path[n - k] = '\0';
	}
}

/* Whether pid is a live stripedb process (our binary: guards against pid reuse after a
 * crash). Reaps our own exited children. */
static int pid_alive(int pid)
{
	char path[64], exe[PATH_MAX], self[PATH_MAX];
	ssize_t n;

	if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) {
		return 0;
	}
	if (waitpid(pid, NULL, WNOHANG) == pid) {
		return 0;
	}
	snprintf(path, sizeof path, "/proc/%d/exe", pid);
	n = readlink(path, exe, sizeof exe - 1);
	if (n <= 0) {
		return 0; /* a zombie that is not our child, or gone */
	}
	exe[n] = '\0';
	self_exe(self, sizeof self);
	/* a binary rebuilt while the cluster runs: the kernel names the old file "... (deleted)" */
	strip_deleted(exe);
	strip_deleted(self);
	return strcmp(exe, self) == 0;
}

static int wait_healthy(dev_cluster *c, dev_proc *p)
{
	uint64_t deadline = sdb_mono_ms() + DEV_START_TIMEOUT_MS;

	while (sdb_mono_ms() < deadline) {
		if (!pid_alive(p->pid)) {
			fprintf(stderr, "stripedb dev: %s exited during start; see %s/logs/%s.log\n",
				p->name, c->dir, p->name);
			return -1;
		}
		if (http_status(p->http, "/healthz") == 200) {
			return 0;
		}
		sdb_sleep_ms(50);
	}
	fprintf(stderr, "stripedb dev: %s did not become healthy in %d s; see %s/logs/%s.log\n",
		p->name, DEV_START_TIMEOUT_MS / 1000, c->dir, p->name);
	return -1;
}

/* --- cluster.json --- */

static int save_cluster(const dev_cluster *c)
{
	bson_t doc = BSON_INITIALIZER, arr;
	char path[PATH_MAX + 32], tmp[PATH_MAX + 40];
	char *json;
	size_t len;
	FILE *f;

	BSON_APPEND_UTF8(&doc, "dir", c->dir);
	BSON_APPEND_UTF8(&doc, "cdc", c->cdc);
	BSON_APPEND_UTF8(&doc, "kafka", c->kafka);
	BSON_APPEND_INT32(&doc, "kafkaPid", c->kafka_pid);
	BSON_APPEND_ARRAY_BEGIN(&doc, "processes", &arr);
	for (int i = 0; i < c->n; i++) {
		const dev_proc *p = &c->procs[i];
		bson_t d, a;
		char k[16];
		snprintf(k, sizeof k, "%d", i);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_UTF8(&d, "name", p->name);
		BSON_APPEND_UTF8(&d, "role", p->role);
		BSON_APPEND_UTF8(&d, "set", p->set);
		BSON_APPEND_INT32(&d, "pid", p->pid);
		BSON_APPEND_INT32(&d, "wire", p->wire);
		BSON_APPEND_INT32(&d, "http", p->http);
		BSON_APPEND_INT32(&d, "raft", p->raft);
		BSON_APPEND_INT32(&d, "grpc", p->grpc);
		BSON_APPEND_ARRAY_BEGIN(&d, "argv", &a);
		for (int j = 0; j < p->argc; j++) {
			snprintf(k, sizeof k, "%d", j);
			bson_append_utf8(&a, k, -1, p->argv[j], -1);
		}
		bson_append_array_end(&d, &a);
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(&doc, &arr);
	json = bson_as_relaxed_extended_json(&doc, &len);
	snprintf(path, sizeof path, "%s/cluster.json", c->dir);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	f = fopen(tmp, "w");
	if (f == NULL || fwrite(json, 1, len, f) != len || fputc('\n', f) == EOF || fclose(f) != 0 ||
	    rename(tmp, path) != 0) {
		fprintf(stderr, "stripedb dev: cannot write %s: %s\n", path, strerror(errno));
		bson_free(json);
		bson_destroy(&doc);
		return -1;
	}
	bson_free(json);
	bson_destroy(&doc);
	return 0;
}

static int load_cluster(const char *dir, dev_cluster *c)
{
	char path[PATH_MAX + 32];
	bson_error_t e;
	bson_t *doc;
	bson_iter_t it, arr, d, a;

	memset(c, 0, sizeof *c);
	snprintf(path, sizeof path, "%s/cluster.json", dir);
	{
		FILE *f = fopen(path, "r");
		char *buf;
		long len;
		if (f == NULL) {
			fprintf(stderr, "stripedb dev: no cluster in %s (%s): run `stripedb dev up --dir %s`\n",
				dir, strerror(errno), dir);
			return -1;
		}
		fseek(f, 0, SEEK_END);
		len = ftell(f);
		fseek(f, 0, SEEK_SET);
		buf = sdb_malloc((size_t)len + 1);
		if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
			len = 0;
		}
		fclose(f);
		doc = bson_new_from_json((const uint8_t *)buf, len, &e);
		free(buf);
	}
	if (doc == NULL) {
		fprintf(stderr, "stripedb dev: %s is not valid JSON: %s\n", path, e.message);
		return -1;
	}
	snprintf(c->dir, sizeof c->dir, "%s", dir);
	if (bson_iter_init_find(&it, doc, "cdc") && BSON_ITER_HOLDS_UTF8(&it)) {
		snprintf(c->cdc, sizeof c->cdc, "%s", bson_iter_utf8(&it, NULL));
	}
	if (bson_iter_init_find(&it, doc, "kafka") && BSON_ITER_HOLDS_UTF8(&it)) {
		snprintf(c->kafka, sizeof c->kafka, "%s", bson_iter_utf8(&it, NULL));
	}
	if (bson_iter_init_find(&it, doc, "kafkaPid")) {
		c->kafka_pid = bson_iter_as_int64(&it) > 0 ? (int)bson_iter_as_int64(&it) : 0;
	}
	if (bson_iter_init_find(&it, doc, "processes") && bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr) && c->n < DEV_MAX_PROCS) {
			dev_proc *p = &c->procs[c->n++];
			if (!bson_iter_recurse(&arr, &d)) {
				continue;
			}
			while (bson_iter_next(&d)) {
				const char *k = bson_iter_key(&d);
				if (strcmp(k, "name") == 0 && BSON_ITER_HOLDS_UTF8(&d)) {
					snprintf(p->name, sizeof p->name, "%s", bson_iter_utf8(&d, NULL));
				} else if (strcmp(k, "role") == 0 && BSON_ITER_HOLDS_UTF8(&d)) {
					snprintf(p->role, sizeof p->role, "%s", bson_iter_utf8(&d, NULL));
				} else if (strcmp(k, "set") == 0 && BSON_ITER_HOLDS_UTF8(&d)) {
					snprintf(p->set, sizeof p->set, "%s", bson_iter_utf8(&d, NULL));
				} else if (strcmp(k, "pid") == 0) {
					p->pid = (int)bson_iter_as_int64(&d);
				} else if (strcmp(k, "wire") == 0) {
					p->wire = (int)bson_iter_as_int64(&d);
				} else if (strcmp(k, "http") == 0) {
					p->http = (int)bson_iter_as_int64(&d);
				} else if (strcmp(k, "raft") == 0) {
					p->raft = (int)bson_iter_as_int64(&d);
				} else if (strcmp(k, "grpc") == 0) {
					p->grpc = (int)bson_iter_as_int64(&d);
				} else if (strcmp(k, "argv") == 0 && bson_iter_recurse(&d, &a)) {
					while (bson_iter_next(&a) && p->argc + 1 < DEV_MAX_ARGS) {
						if (BSON_ITER_HOLDS_UTF8(&a)) {
							p->argv[p->argc++] = sdb_strdup(bson_iter_utf8(&a, NULL));
						}
					}
				}
			}
		}
	}
	bson_destroy(doc);
	return 0;
}

static void free_cluster(dev_cluster *c)
{
	for (int i = 0; i < c->n; i++) {
		for (int j = 0; j < c->procs[i].argc; j++) {
			free(c->procs[i].argv[j]);
		}
	}
}

static void metadata_uri(const dev_cluster *c, char *buf, size_t n)
{
	char hosts[1024];
	size_t o = 0;
	char *uri;

	hosts[0] = '\0';
	for (int i = 0; i < c->n && o < sizeof hosts; i++) {
		if (strcmp(c->procs[i].role, "metadata") == 0) {
			o += (size_t)snprintf(hosts + o, sizeof hosts - o, "%s127.0.0.1:%d",
					      o ? "," : "", c->procs[i].wire);
		}
	}
	uri = sdb_meta_uri(hosts, false, 20000, 0, 0);
	snprintf(buf, n, "%s", uri);
	free(uri);
}

static void addr_list(const dev_cluster *c, const char *role, int grpc, char *buf, size_t n)
{
	size_t o = 0;

	buf[0] = '\0';
	for (int i = 0; i < c->n && o < n; i++) {
		const dev_proc *p = &c->procs[i];
		if (strcmp(p->role, role) == 0 && (grpc ? p->grpc : p->wire) != 0) {
			o += (size_t)snprintf(buf + o, n - o, "%s127.0.0.1:%d", o == 0 ? "" : ",",
					      grpc ? p->grpc : p->wire);
		}
	}
}

/* The replica-set URI of shard set: every member's wire address. */
static void shard_uri(const dev_cluster *c, const char *set, char *buf, size_t n)
{
	cli_rs_uri u;

	cli_rs_uri_begin(&u, buf, n);
	for (int i = 0; i < c->n; i++) {
		const dev_proc *p = &c->procs[i];
		if (strcmp(p->role, "shard") == 0 && strcmp(p->set, set) == 0)
			cli_rs_uri_add(&u, "127.0.0.1", p->wire);
	}
	cli_rs_uri_end(&u, set);
}

/* Whether the member answers hello as the writable primary (and, when want_hosts > 0,
 * lists at least that many members in hosts: a driver keeps only the members the primary
 * lists, so a set is handed out once every member has registered with the primary). */
static int is_primary_listing(const dev_proc *p, int want_hosts)
{
	char uri[160];
	mongoc_client_t *cl;
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it;
	int yes = 0;

	snprintf(uri, sizeof uri,
		 "mongodb://127.0.0.1:%d/?directConnection=true&serverSelectionTimeoutMS=1000&"
		 "connectTimeoutMS=1000",
		 p->wire);
	cl = mongoc_client_new(uri);
	BSON_APPEND_INT32(&cmd, "hello", 1);
	if (cl != NULL && mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e)) {
		yes = bson_iter_init_find(&it, &reply, "isWritablePrimary") && bson_iter_as_bool(&it);
		if (yes && want_hosts > 0) {
			bson_iter_t h;
			int n = 0;
			if (bson_iter_init_find(&it, &reply, "hosts") && BSON_ITER_HOLDS_ARRAY(&it) &&
			    bson_iter_recurse(&it, &h))
				while (bson_iter_next(&h))
					n++;
			yes = n >= want_hosts;
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(cl);
	return yes;
}

static int is_primary(const dev_proc *p)
{
	return is_primary_listing(p, 0);
}

static const dev_proc *set_primary(const dev_cluster *c, const char *set, int timeout_ms,
				   bool all_listed)
{
	uint64_t deadline = sdb_mono_ms() + (uint64_t)timeout_ms;
	int members = 0, alive = 0;

	for (int i = 0; i < c->n; i++)
		if (strcmp(c->procs[i].role, "shard") == 0 && strcmp(c->procs[i].set, set) == 0) {
			members++;
			alive += pid_alive(c->procs[i].pid) ? 1 : 0;
		}
	do {
		for (int i = 0; i < c->n; i++) {
			const dev_proc *p = &c->procs[i];
			/* with every member running, wait until the primary lists them all */
			if (strcmp(p->role, "shard") == 0 && strcmp(p->set, set) == 0 &&
			    pid_alive(p->pid) &&
			    is_primary_listing(p, all_listed && alive == members ? members : 0)) {
				return p;
			}
		}
		if (timeout_ms > 0) {
			sdb_sleep_ms(50);
		}
	} while (sdb_mono_ms() < deadline);
	return NULL;
}

/* Register every shard with the metadata service by its replica-set URI, once the set has
 * a primary (idempotent: an existing id is fine). */
static int register_shards(const dev_cluster *c)
{
	char uri[1024];
	mongoc_client_t *cl;
	int rc = 0;

	metadata_uri(c, uri, sizeof uri);
	cl = mongoc_client_new(uri);
	if (cl == NULL) {
		fprintf(stderr, "stripedb dev: bad metadata uri %s\n", uri);
		return -1;
	}
	for (int i = 0; i < c->n; i++) {
		const dev_proc *p = &c->procs[i];
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		char suri[1024];
		uint64_t deadline = sdb_mono_ms() + 30000;
		int seen = 0;
		if (strcmp(p->role, "shard") != 0) {
			continue;
		}
		for (int j = 0; j < i; j++) {
			seen |= strcmp(c->procs[j].role, "shard") == 0 && strcmp(c->procs[j].set, p->set) == 0;
		}
		if (seen) {
			continue; /* one addShard per set */
		}
		if (set_primary(c, p->set, 30000, true) == NULL) {
			fprintf(stderr, "stripedb dev: shard %s elected no primary in 30 s; see %s/logs/\n",
				p->set, c->dir);
			rc = -1;
			break;
		}
		shard_uri(c, p->set, suri, sizeof suri);
		BSON_APPEND_UTF8(&cmd, "addShard", p->set);
		BSON_APPEND_UTF8(&cmd, "uri", suri);
		for (;;) {
			bool ok = mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e);
			bson_destroy(&reply);
			if (ok || e.code == 11000) {
				break;
			}
			if (sdb_mono_ms() > deadline) {
				fprintf(stderr, "stripedb dev: addShard %s: %s\n", p->set, e.message);
				rc = -1;
				break;
			}
			sdb_sleep_ms(100); /* leader election in progress: retry with a deadline */
		}
		bson_destroy(&cmd);
		if (rc != 0) {
			break;
		}
	}
	if (rc == 0) {
		/* every member of a dev cluster runs this binary: its highest op version
		 * (raft/migstate.h: one migration per chunk, MongoDB's hashed split points,
		 * draining shards, config.mongos) */
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		BSON_APPEND_INT32(&cmd, "setOpVersion", MIGSTATE_OP_VERSION_MAX);
		if (!mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e))
			fprintf(stderr, "stripedb dev: setOpVersion %d: %s\n", MIGSTATE_OP_VERSION_MAX,
				e.message);
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
	mongoc_client_destroy(cl);
	return rc;
}

static dev_proc *add_proc(dev_cluster *c, const char *role, const char *name)
{
	dev_proc *p;
	char exe[PATH_MAX];

	if (c->n == DEV_MAX_PROCS) {
		fprintf(stderr, "stripedb dev: too many processes\n");
		exit(2);
	}
	p = &c->procs[c->n++];
	memset(p, 0, sizeof *p);
	snprintf(p->role, sizeof p->role, "%s", role);
	snprintf(p->name, sizeof p->name, "%s", name);
	self_exe(exe, sizeof exe);
	proc_arg(p, "%s", exe);
	proc_arg(p, "--role=%s", role);
	p->http = reserve_port();
	return p;
}

static int start_kafka_mock(dev_cluster *c)
{
	char exe[PATH_MAX], out[PATH_MAX + 32], log[PATH_MAX + 32];
	uint64_t deadline;
	pid_t pid;
	int fd;

	self_exe(exe, sizeof exe);
	snprintf(out, sizeof out, "%s/kafka.bootstrap", c->dir);
	snprintf(log, sizeof log, "%s/logs/kafka-mock.log", c->dir);
	unlink(out);
	fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	pid = fork();
	if (pid == 0) {
		setsid();
		dup2(fd, 1);
		dup2(fd, 2);
		execl(exe, exe, "dev", "kafka-mock", "--out", out, (char *)NULL);
		_exit(127);
	}
	close(fd);
	c->kafka_pid = (int)pid;
	deadline = sdb_mono_ms() + 20000;
	while (sdb_mono_ms() < deadline) {
		FILE *f = fopen(out, "r");
		if (f != NULL) {
			int ok = fgets(c->kafka, sizeof c->kafka, f) != NULL;
			fclose(f);
			if (ok && strchr(c->kafka, '\n') != NULL) {
				c->kafka[strcspn(c->kafka, "\n")] = '\0';
				return 0;
			}
		}
		sdb_sleep_ms(20);
	}
	fprintf(stderr, "stripedb dev: the Kafka mock broker did not start; see %s\n", log);
	return -1;
}

static void usage_dev(FILE *f)
{
	fprintf(f, "usage: stripedb dev up [--dir DIR] [--shards N] [--shard-members 1|3|5]\n"
		   "                       [--proxies N] [--coordinators N]\n"
		   "                       [--cdc embedded|kafka] [--log-level LEVEL]\n"
		   "       stripedb dev status [--dir DIR] [--json]\n"
		   "       stripedb dev down [--dir DIR]\n"
		   "       stripedb dev kill NAME|ROLE|SHARD [--dir DIR]   (SHARD: its primary)\n"
		   "       stripedb dev restart NAME [--dir DIR]\n"
		   "DIR defaults to ./stripedb-dev.\n");
}

static int parse_count(const char *flag, const char *v, int lo, int hi, int *out)
{
	char *end;
	long n = strtol(v, &end, 10);

	if (*v == '\0' || *end != '\0' || n < lo || n > hi) {
		fprintf(stderr, "stripedb dev: %s: '%s' is not an integer in %d..%d\n", flag, v, lo, hi);
		return -1;
	}
	*out = (int)n;
	return 0;
}

static void stop_all(dev_cluster *c, int sig_first);

/* The cluster's addresses, processes and how to stop it (after up or a resume). */
static void print_summary(const dev_cluster *c, const char *meta)
{
	printf("\n  applications:  mongodb://");
	for (int i = 0, first = 1; i < c->n; i++) {
		if (strcmp(c->procs[i].role, "proxy") == 0) {
			printf("%s127.0.0.1:%d", first ? "" : ",", c->procs[i].wire);
			first = 0;
		}
	}
	printf("/\n");
	{
		char uri[1024];
		metadata_uri(c, uri, sizeof uri);
		printf("  metadata:      %s\n", uri);
	}
	for (int i = 0; i < c->n; i++) {
		const dev_proc *p = &c->procs[i];
		int seen = 0;
		char uri[1024];
		for (int j = 0; j < i; j++) {
			seen |= strcmp(c->procs[j].role, "shard") == 0 && strcmp(c->procs[j].set, p->set) == 0;
		}
		if (strcmp(p->role, "shard") == 0 && p->set[0] && !seen) {
			shard_uri(c, p->set, uri, sizeof uri);
			printf("  %-14s %s\n", p->set, uri);
		}
	}
	printf("  ctl:           stripedb ctl --metadata=%s metadata status | shard list\n", meta);
	if (strcmp(c->cdc, "kafka") == 0) {
		printf("  kafka (mock):  %s\n", c->kafka);
	}
	printf("\n  %-15s %-12s %7s  %-21s %s\n", "NAME", "ROLE", "PID", "WIRE/GRPC", "METRICS");
	for (int i = 0; i < c->n; i++) {
		const dev_proc *p = &c->procs[i];
		char addr[32] = "-";
		if (p->wire != 0) {
			snprintf(addr, sizeof addr, "127.0.0.1:%d", p->wire);
		} else if (p->grpc != 0) {
			snprintf(addr, sizeof addr, "127.0.0.1:%d", p->grpc);
		}
		printf("  %-15s %-12s %7d  %-21s http://127.0.0.1:%d/metrics\n", p->name, p->role,
		       p->pid, addr, p->http);
	}
	printf("\n  logs: %s/logs/   stop: stripedb dev down --dir %s\n", c->dir, c->dir);
}

/* Start every process of c in dependency order (metadata, shards, rate limiter, proxies,
 * coordinators), each role's processes once the previous role's answer /healthz;
 * register_new: register the shards with metadata after they start (a new cluster).
 * Saves cluster.json as it goes. On failure every started process is killed; -1. */
static int start_in_order(dev_cluster *c, bool register_new)
{
	static const char *const order[] = {"metadata", "shard", "ratelimit", "proxy", "coordinator"};
	for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
		for (int i = 0; i < c->n; i++) {
			if (strcmp(c->procs[i].role, order[k]) == 0 && spawn(c, &c->procs[i]) != 0) {
				stop_all(c, SIGKILL);
				return -1;
			}
		}
		save_cluster(c);
		for (int i = 0; i < c->n; i++) {
			if (strcmp(c->procs[i].role, order[k]) == 0 && wait_healthy(c, &c->procs[i]) != 0) {
				stop_all(c, SIGKILL);
				return -1;
			}
		}
		if (register_new && strcmp(order[k], "shard") == 0 && register_shards(c) != 0) {
			stop_all(c, SIGKILL);
			return -1;
		}
	}
	save_cluster(c);
	return 0;
}

/* `dev up` in a DIR whose cluster was stopped (dev down, a reboot): start every recorded
 * process again with its recorded arguments, so the metadata group finds its members at
 * the addresses its Raft log names and the shards keep their data. Returns the exit code. */
static int dev_resume(dev_cluster *c)
{
	char meta[512];

	if (strcmp(c->cdc, "kafka") == 0) {
		fprintf(stderr, "stripedb dev up: %s holds a stopped cluster whose CDC log lived in "
				"a Kafka mock broker that is gone; remove %s/data (or use another "
				"--dir) to start afresh\n", c->dir, c->dir);
		return 1;
	}
	printf("resuming the stopped cluster in %s (its recorded processes, ports and data; "
	       "layout flags do not apply)\n", c->dir);
	fflush(stdout);
	if (start_in_order(c, false) != 0)
		return 1;
	addr_list(c, "metadata", 0, meta, sizeof meta);
	print_summary(c, meta);
	return 0;
}

static int dev_up(int argc, char **argv)
{
	static dev_cluster cl;
	dev_cluster *c = &cl;
	const char *dir = "stripedb-dev";
	const char *level = "info";
	int shards = 3, members_per_shard = 3, proxies = 2, coords = 2;
	char members[512], meta[512];
	int meta_idx[3];

	memset(c, 0, sizeof *c);
	srand((unsigned)getpid() ^ (unsigned)sdb_mono_ms());
	snprintf(c->cdc, sizeof c->cdc, "embedded");
	for (int i = 0; i < argc; i += 2) { /* --flag value pairs */
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--help") == 0) {
			usage_dev(stdout);
			return 0;
		}
		if (v == NULL) {
			fprintf(stderr, "stripedb dev up: %s needs a value\n", a);
			return 2;
		}
		if (strcmp(a, "--dir") == 0) {
			dir = v;
		} else if (strcmp(a, "--shards") == 0) {
			if (parse_count(a, v, 1, 16, &shards) != 0) {
				return 2;
			}
		} else if (strcmp(a, "--shard-members") == 0) {
			if (parse_count(a, v, 1, 5, &members_per_shard) != 0) {
				return 2;
			}
			if (members_per_shard % 2 == 0) {
				fprintf(stderr, "stripedb dev up: --shard-members must be 1, 3 or 5 (an odd "
						"number: a majority must survive a failure), not %d\n",
					members_per_shard);
				return 2;
			}
		} else if (strcmp(a, "--proxies") == 0) {
			if (parse_count(a, v, 1, 8, &proxies) != 0) {
				return 2;
			}
		} else if (strcmp(a, "--coordinators") == 0) {
			if (parse_count(a, v, 0, 8, &coords) != 0) {
				return 2;
			}
		} else if (strcmp(a, "--cdc") == 0) {
			if (strcmp(v, "embedded") != 0 && strcmp(v, "kafka") != 0) {
				fprintf(stderr, "stripedb dev up: --cdc must be embedded or kafka, not '%s'\n", v);
				return 2;
			}
			snprintf(c->cdc, sizeof c->cdc, "%s", v);
		} else if (strcmp(a, "--log-level") == 0) {
			level = v;
		} else {
			fprintf(stderr, "stripedb dev up: unknown flag %s (see stripedb dev --help)\n", a);
			return 2;
		}
	}
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "stripedb dev: cannot create %s: %s\n", dir, strerror(errno));
		return 1;
	}
	if (realpath(dir, c->dir) == NULL) {
		fprintf(stderr, "stripedb dev: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	{
		static dev_cluster old;
		char *cj = sdb_asprintf("%s/cluster.json", c->dir);
		int exists = access(cj, F_OK) == 0;
		free(cj);
		if (exists && load_cluster(c->dir, &old) == 0) {
			int live = 0;
			for (int i = 0; i < old.n; i++) {
				live += pid_alive(old.procs[i].pid);
			}
			if (live > 0) {
				free_cluster(&old);
				fprintf(stderr, "stripedb dev: a cluster is already running in %s "
						"(stripedb dev down --dir %s first)\n", c->dir, c->dir);
				return 1;
			}
			{
				int rc = dev_resume(&old);
				free_cluster(&old);
				return rc;
			}
		}
	}
	{
		char *d = sdb_asprintf("%s/logs", c->dir);
		mkdir(d, 0755);
		free(d);
		d = sdb_asprintf("%s/data", c->dir);
		mkdir(d, 0755);
		free(d);
	}

	/* Plan every process and reserve its ports. */
	for (int i = 0; i < 3; i++) {
		char name[32];
		dev_proc *p;
		snprintf(name, sizeof name, "metadata-%d", i + 1);
		meta_idx[i] = c->n;
		p = add_proc(c, "metadata", name);
		p->wire = reserve_port();
		p->raft = reserve_port();
	}
	{
		size_t o = 0;
		members[0] = '\0';
		for (int i = 0; i < 3; i++) {
			o += (size_t)snprintf(members + o, sizeof members - o, "%s%d@127.0.0.1:%d",
					      i ? "," : "", i + 1, c->procs[meta_idx[i]].raft);
		}
	}
	addr_list(c, "metadata", 0, meta, sizeof meta);
	for (int i = 0; i < 3; i++) {
		dev_proc *p = &c->procs[meta_idx[i]];
		proc_arg(p, "--node-id=%d", i + 1);
		proc_arg(p, "--data-dir=%s/data/%s", c->dir, p->name);
		proc_arg(p, "--listen=127.0.0.1:%d", p->wire);
		proc_arg(p, "--raft-listen=127.0.0.1:%d", p->raft);
		proc_arg(p, "--http-listen=127.0.0.1:%d", p->http);
		proc_arg(p, "--bootstrap-members=%s", members);
		proc_arg(p, "--log-level=%s", level);
	}
	/* Shard replica sets: a Raft group of members_per_shard members per shard. */
	for (int i = 0; i < shards; i++) {
		char set[32], list[512];
		int first = c->n;
		size_t o = 0;
		snprintf(set, sizeof set, "shard-%c", 'a' + i);
		for (int k = 0; k < members_per_shard; k++) {
			char name[32];
			dev_proc *p;
			if (members_per_shard == 1) {
				snprintf(name, sizeof name, "%s", set);
			} else {
				snprintf(name, sizeof name, "%.24s-%d", set, (k + 1) % 10);
			}
			p = add_proc(c, "shard", name);
			snprintf(p->set, sizeof p->set, "%s", set);
			p->wire = reserve_port();
			p->raft = reserve_port();
			o += (size_t)snprintf(list + o, o < sizeof list ? sizeof list - o : 0,
					      "%s%d@127.0.0.1:%d", k ? "," : "", k + 1, p->raft);
		}
		for (int k = 0; k < members_per_shard; k++) {
			dev_proc *p = &c->procs[first + k];
			proc_arg(p, "--replica-set=%s", set);
			proc_arg(p, "--node-id=%d", k + 1);
			proc_arg(p, "--data-dir=%s/data/%s", c->dir, p->name);
			proc_arg(p, "--listen=127.0.0.1:%d", p->wire);
			proc_arg(p, "--raft-listen=127.0.0.1:%d", p->raft);
			proc_arg(p, "--bootstrap-members=%s", list);
			proc_arg(p, "--http-listen=127.0.0.1:%d", p->http);
			proc_arg(p, "--log-level=%s", level);
		}
	}
	{
		dev_proc *p = add_proc(c, "ratelimit", "ratelimit-1");
		p->grpc = reserve_port();
	}
	for (int i = 0; i < proxies; i++) {
		char name[32];
		dev_proc *p;
		snprintf(name, sizeof name, "proxy-%d", i + 1);
		p = add_proc(c, "proxy", name);
		p->wire = reserve_port();
		p->grpc = reserve_port();
	}
	/* The rate-limit peer ring: the rate limiter and every proxy (proxies decide quotas
	 * in-process and forward to a key's owner) register with the metadata service and
	 * build their rings from it (issue #23): no static --peers. */
	for (int i = 0; i < c->n; i++) {
		dev_proc *p = &c->procs[i];
		if (strcmp(p->role, "ratelimit") == 0) {
			proc_arg(p, "--node-id=%s", p->name);
			proc_arg(p, "--http-listen=127.0.0.1:%d", p->http);
			proc_arg(p, "--grpc-listen=127.0.0.1:%d", p->grpc);
			proc_arg(p, "--metadata=%s", meta);
			proc_arg(p, "--log-level=%s", level);
		} else if (strcmp(p->role, "proxy") == 0) {
			proc_arg(p, "--node-id=%s", p->name);
			proc_arg(p, "--listen=127.0.0.1:%d", p->wire);
			proc_arg(p, "--http-listen=127.0.0.1:%d", p->http);
			proc_arg(p, "--metadata=%s", meta);
			proc_arg(p, "--grpc-listen=127.0.0.1:%d", p->grpc);
			proc_arg(p, "--log-level=%s", level);
		}
	}
	for (int i = 0; i < coords; i++) {
		char name[32];
		snprintf(name, sizeof name, "coordinator-%d", i + 1);
		add_proc(c, "coordinator", name);
	}

	release_ports();
	if (strcmp(c->cdc, "kafka") == 0 && start_kafka_mock(c) != 0) {
		stop_all(c, SIGKILL);
		return 1;
	}
	for (int i = 0; i < c->n; i++) {
		dev_proc *p = &c->procs[i];
		if (strcmp(p->role, "coordinator") == 0) {
			proc_arg(p, "--node-id=%s", p->name);
			proc_arg(p, "--http-listen=127.0.0.1:%d", p->http);
			proc_arg(p, "--metadata=%s", meta);
			if (strcmp(c->cdc, "kafka") == 0) {
				proc_arg(p, "--cdc=kafka:%s", c->kafka);
			} else {
				proc_arg(p, "--cdc=embedded:%s/data/cdc", c->dir);
			}
			proc_arg(p, "--archive=file:%s/data/archive", c->dir);
			proc_arg(p, "--log-level=%s", level);
		}
	}

	/* Start in dependency order: metadata, shards, then the rest. */
	printf("starting a local stripedb cluster in %s\n", c->dir);
	fflush(stdout);
	if (start_in_order(c, true) != 0)
		return 1;

	print_summary(c, meta);
	free_cluster(c);
	return 0;
}

static void stop_all(dev_cluster *c, int sig_first)
{
	static const char *const order[] = {"proxy", "coordinator", "ratelimit", "shard", "metadata"};

	for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
		uint64_t deadline;
		int any;
		for (int i = 0; i < c->n; i++) {
			if (strcmp(c->procs[i].role, order[k]) == 0 && pid_alive(c->procs[i].pid)) {
				kill(c->procs[i].pid, sig_first);
			}
		}
		deadline = sdb_mono_ms() + 20000;
		do {
			any = 0;
			for (int i = 0; i < c->n; i++) {
				if (strcmp(c->procs[i].role, order[k]) == 0 && pid_alive(c->procs[i].pid)) {
					any = 1;
				}
			}
			if (any) {
				sdb_sleep_ms(20);
			}
		} while (any && sdb_mono_ms() < deadline);
		for (int i = 0; i < c->n; i++) {
			if (strcmp(c->procs[i].role, order[k]) == 0 && pid_alive(c->procs[i].pid)) {
				fprintf(stderr, "stripedb dev: %s did not stop in 20 s, SIGKILL\n",
					c->procs[i].name);
				kill(c->procs[i].pid, SIGKILL);
			}
		}
	}
	if (c->kafka_pid > 0 && pid_alive(c->kafka_pid)) {
		kill(c->kafka_pid, SIGTERM);
		uint64_t kdeadline = sdb_mono_ms() + 5000;
		while (pid_alive(c->kafka_pid) && sdb_mono_ms() < kdeadline) {
			sdb_sleep_ms(20);
		}
		if (pid_alive(c->kafka_pid)) {
			kill(c->kafka_pid, SIGKILL);
		}
	}
}

static int parse_dir(int argc, char **argv, const char **dir, int *json, const char **name)
{
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
			*dir = argv[++i];
		} else if (strncmp(argv[i], "--dir=", 6) == 0) {
			*dir = argv[i] + 6;
		} else if (strcmp(argv[i], "--json") == 0 && json != NULL) {
			*json = 1;
		} else if (argv[i][0] != '-' && name != NULL && *name == NULL) {
			*name = argv[i];
		} else {
			fprintf(stderr, "stripedb dev: unexpected argument '%s' (see stripedb dev --help)\n",
				argv[i]);
			return -1;
		}
	}
	return 0;
}

static int dev_status(int argc, char **argv)
{
	dev_cluster c;
	const char *dir = "stripedb-dev";
	int json = 0, down = 0;

	if (parse_dir(argc, argv, &dir, &json, NULL) != 0) {
		return 2;
	}
	if (load_cluster(dir, &c) != 0) {
		return 1;
	}
	if (!json) {
		printf("%-15s %-12s %7s  %-9s %-34s %s\n", "NAME", "ROLE", "PID", "STATE", "METRICS",
		       "REPLICA SET");
	}
	for (int i = 0; i < c.n; i++) {
		const dev_proc *p = &c.procs[i];
		int alive = pid_alive(p->pid);
		long st = alive ? http_status(p->http, "/healthz") : 0;
		const char *state = !alive ? "down" : st == 200 ? "healthy" : "unhealthy";
		down += st != 200;
		/* a shard member: its set and whether it is the primary now */
		int primary = strcmp(p->role, "shard") == 0 && alive && is_primary(p);
		if (json) {
			printf("{\"name\": \"%s\", \"role\": \"%s\", \"pid\": %d, \"state\": \"%s\", "
			       "\"wire\": %d, \"http\": %d, \"grpc\": %d, \"set\": \"%s\", "
			       "\"primary\": %s}\n",
			       p->name, p->role, p->pid, state, p->wire, p->http, p->grpc, p->set,
			       primary ? "true" : "false");
		} else {
			char metrics[48];
			snprintf(metrics, sizeof metrics, "http://127.0.0.1:%d/metrics", p->http);
			printf("%-15s %-12s %7d  %-9s %-34s %s%s%s\n", p->name, p->role, p->pid, state,
			       metrics, p->set, p->set[0] ? " " : "",
			       !p->set[0] || !alive ? "" : primary ? "primary" : "secondary");
		}
	}
	free_cluster(&c);
	return down == 0 ? 0 : 1;
}

static int dev_down(int argc, char **argv)
{
	dev_cluster c;
	const char *dir = "stripedb-dev";

	if (parse_dir(argc, argv, &dir, NULL, NULL) != 0) {
		return 2;
	}
	if (load_cluster(dir, &c) != 0) {
		return 1;
	}
	stop_all(&c, SIGTERM);
	printf("stopped the cluster in %s (data and logs kept)\n", c.dir);
	free_cluster(&c);
	return 0;
}

/* The metadata leader's name, asked through the replica-set view; NULL when unknown. */
static const dev_proc *metadata_leader(const dev_cluster *c)
{
	for (int i = 0; i < c->n; i++) {
		const dev_proc *p = &c->procs[i];
		char uri[128];
		mongoc_client_t *cl;
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		bson_iter_t it;
		int leader = 0;
		if (strcmp(p->role, "metadata") != 0 || !pid_alive(p->pid)) {
			continue;
		}
		char hp[64], *u;
		snprintf(hp, sizeof hp, "127.0.0.1:%d", p->wire);
		u = sdb_meta_uri(hp, true, 2000, 0, 0);
		snprintf(uri, sizeof uri, "%s", u);
		free(u);
		cl = mongoc_client_new(uri);
		BSON_APPEND_INT32(&cmd, "hello", 1);
		if (cl != NULL && mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e)) {
			leader = bson_iter_init_find(&it, &reply, "isWritablePrimary") &&
				 bson_iter_as_bool(&it);
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
		mongoc_client_destroy(cl);
		if (leader) {
			return p;
		}
	}
	return NULL;
}

static int dev_kill_restart(int argc, char **argv, int restart)
{
	dev_cluster c;
	const char *dir = "stripedb-dev";
	const char *name = NULL;
	const dev_proc *target = NULL;
	int rc = 0;

	if (parse_dir(argc, argv, &dir, NULL, &name) != 0) {
		return 2;
	}
	if (name == NULL) {
		fprintf(stderr, "stripedb dev %s: name a process (e.g. shard-a) or a role\n",
			restart ? "restart" : "kill");
		return 2;
	}
	if (load_cluster(dir, &c) != 0) {
		return 1;
	}
	for (int i = 0; i < c.n; i++) {
		if (strcmp(c.procs[i].name, name) == 0) {
			target = &c.procs[i];
		}
	}
	if (target == NULL && !restart) {
		if (strcmp(name, "metadata") == 0 || strcmp(name, "metadata-leader") == 0) {
			target = metadata_leader(&c);
		}
		for (int i = 0; i < c.n && target == NULL; i++) {
			if (strcmp(c.procs[i].role, "shard") == 0 && strcmp(c.procs[i].set, name) == 0) {
				target = set_primary(&c, name, 0, false);
				if (target == NULL) {
					fprintf(stderr, "stripedb dev: shard %s has no primary now\n", name);
					free_cluster(&c);
					return 1;
				}
			}
		}
		for (int i = 0; i < c.n && target == NULL; i++) {
			if (strcmp(c.procs[i].role, name) == 0 && pid_alive(c.procs[i].pid)) {
				target = &c.procs[i];
			}
		}
	}
	if (target == NULL) {
		fprintf(stderr, "stripedb dev: no live process named or of role '%s'\n", name);
		free_cluster(&c);
		return 1;
	}
	if (!restart) {
		if (!pid_alive(target->pid)) {
			fprintf(stderr, "stripedb dev: %s is not running\n", target->name);
			rc = 1;
		} else {
			kill(target->pid, SIGKILL);
			printf("killed %s (pid %d%s%s) with SIGKILL\n", target->name, target->pid,
			       strcmp(target->name, name) != 0 && target->set[0] ? ", primary of " : "",
			       strcmp(target->name, name) != 0 && target->set[0] ? target->set : "");
		}
	} else {
		dev_proc *p = (dev_proc *)target;
		if (pid_alive(p->pid)) {
			fprintf(stderr, "stripedb dev: %s is still running (pid %d)\n", p->name, p->pid);
			rc = 1;
		} else if (spawn(&c, p) != 0 || wait_healthy(&c, p) != 0 || save_cluster(&c) != 0) {
			rc = 1;
		} else {
			printf("restarted %s (pid %d)\n", p->name, p->pid);
		}
	}
	free_cluster(&c);
	return rc;
}

/* A Kafka-protocol broker for `--cdc kafka`: librdkafka's mock cluster (rdkafka_mock.h),
 * serving until SIGTERM. Writes its bootstrap servers and a newline to --out. */
static int dev_kafka_mock(int argc, char **argv)
{
	const char *out = NULL;
	char errstr[256];
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	sigset_t sigs;
	int sig;
	FILE *f;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
			out = argv[++i];
		}
	}
	if (out == NULL) {
		fprintf(stderr, "stripedb dev kafka-mock: --out FILE is required\n");
		return 2;
	}
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	conf = rd_kafka_conf_new();
	rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof errstr);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
	if (rk == NULL) {
		fprintf(stderr, "stripedb dev kafka-mock: %s\n", errstr);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, 1);
	if (mc == NULL) {
		fprintf(stderr, "stripedb dev kafka-mock: cannot start the mock cluster\n");
		rd_kafka_destroy(rk);
		return 1;
	}
	f = fopen(out, "w");
	if (f == NULL) {
		fprintf(stderr, "stripedb dev kafka-mock: %s: %s\n", out, strerror(errno));
		return 1;
	}
	fprintf(f, "%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fclose(f);
	sigwait(&sigs, &sig);
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}

int cli_dev_main(int argc, char **argv)
{
	int rc;

	if (argc == 0 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "help") == 0) {
		usage_dev(argc == 0 ? stderr : stdout);
		return argc == 0 ? 2 : 0;
	}
	curl_global_init(CURL_GLOBAL_DEFAULT);
	mongoc_init();
	if (strcmp(argv[0], "up") == 0) {
		rc = dev_up(argc - 1, argv + 1);
	} else if (strcmp(argv[0], "status") == 0) {
		rc = dev_status(argc - 1, argv + 1);
	} else if (strcmp(argv[0], "down") == 0) {
		rc = dev_down(argc - 1, argv + 1);
	} else if (strcmp(argv[0], "kill") == 0) {
		rc = dev_kill_restart(argc - 1, argv + 1, 0);
	} else if (strcmp(argv[0], "restart") == 0) {
		rc = dev_kill_restart(argc - 1, argv + 1, 1);
	} else if (strcmp(argv[0], "kafka-mock") == 0) {
		rc = dev_kafka_mock(argc - 1, argv + 1);
	} else {
		fprintf(stderr, "stripedb dev: unknown subcommand '%s' (see stripedb dev --help)\n",
			argv[0]);
		rc = 2;
	}
	mongoc_cleanup();
	curl_global_cleanup();
	return rc;
}

/* --- cli/dev.h: for the commands built on a dev cluster (stripedb demo) --- */

int dev_cluster_load(const char *dir, dev_cluster *c)
{
	return load_cluster(dir, c);
}

void dev_cluster_free(dev_cluster *c)
{
	free_cluster(c);
}

void dev_cluster_stop(dev_cluster *c, int sig)
{
	stop_all(c, sig);
}

int dev_cluster_alive(const dev_cluster *c)
{
	int n = 0;

	for (int i = 0; i < c->n; i++) {
		n += pid_alive(c->procs[i].pid);
	}
	return n + (c->kafka_pid > 0 && pid_alive(c->kafka_pid));
}

void dev_cluster_addrs(const dev_cluster *c, const char *role, int grpc, char *buf, size_t n)
{
	addr_list(c, role, grpc, buf, n);
}

const dev_proc *dev_cluster_primary(const dev_cluster *c, const char *set, int timeout_ms)
{
	return set_primary(c, set, timeout_ms, false);
}

void dev_cluster_shard_uri(const dev_cluster *c, const char *set, char *buf, size_t n)
{
	shard_uri(c, set, buf, n);
}

void dev_self_exe(char *buf, size_t n)
{
	self_exe(buf, n);
}
