/* `stripedb ctl cluster`: build a whole cluster on bare hosts over SSH (issue #11).
 *
 *   stripedb ctl cluster bootstrap --spec FILE [--verbose]
 *   stripedb ctl cluster status --spec FILE [--json]
 *   stripedb ctl cluster config --spec FILE HOST    print the config file bootstrap writes
 *   stripedb ctl cluster agent put PATH MODE OWNER|- SIZE ...  (run on a host, over SSH)
 *   stripedb ctl cluster agent start ROLE CONFIG DATADIR   (run on a host, over SSH)
 *
 * The spec (INI, read with inih like the config file; packaging/cluster.conf.example) has a
 * [cluster] section (SSH options, remote binary, launcher = systemd|direct, default ports,
 * cluster key) and one section per host (address, roles, optional ports and data dir), plus
 * an optional [external-shards] section of NAME = MongoDB connection string.
 *
 * bootstrap, in dependency order: the per-host config file (and key) is written on every
 * host; the metadata members are started and the command waits for a Raft leader (hello,
 * isWritablePrimary); the embedded shards are started and every shard is registered with
 * addShard (an already registered name, 11000, is fine when listShards has it at the
 * spec's URI: bootstrap does not move a registered shard); then the rate limiters, proxies
 * and coordinators. A role whose /healthz already answers 200 is left alone, so re-running
 * on a half-built cluster finishes it and re-running on a complete one changes nothing.
 * Health and the leader are checked over the network from where the command runs. A host
 * whose config cannot be written or whose role cannot be started over SSH (unreachable)
 * is named on stderr then and skipped by the later steps; every other host is still
 * repaired, and the run exits 1 at the end ("cluster incomplete").
 *
 * Remote commands go through the system ssh client (BatchMode=yes), run with fork+exec and
 * an argument vector. The remote side hands the command string to a shell, so every string
 * that enters it (paths, roles, addresses) is first checked against a strict alphabet and
 * then single-quoted. launcher = systemd runs `systemctl enable --now stripedb@ROLE` (the
 * packaged unit reads /etc/stripedb/stripedb.conf); launcher = direct runs the `agent start`
 * helper, which starts `stripedb --role=ROLE --config=CONFIG` in its own session with its
 * output in DATADIR/logs/ROLE.log and its pid in DATADIR/run/ROLE.pid (hosts without
 * systemd, such as the network namespaces of tests/integration/test_multihost.py).
 *
 * Exit codes: 0 the cluster is complete (status: every role healthy), 1 a host or role
 * failed (one stderr line naming it), 2 bad usage or a bad spec.
 */
#include "cli/cli.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <mongoc/mongoc.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

int cli_cluster_main(int argc, char **argv);

#define CL_MAX_HOSTS 32
#define CL_MAX_EXT 16
#define CL_MAX_SSH_OPTS 16
#define CL_MAX_PUT (1024 * 1024)
#define CL_SSH_TIMEOUT_MS 60000
#define CL_PATH 256 /* paths in the spec: short, so every derived path fits PATH_MAX */

enum { R_METADATA, R_SHARD, R_RATELIMIT, R_PROXY, R_COORDINATOR, R__COUNT };

/* Start order (dependency order); names are the --role values. */
static const char *const role_name[R__COUNT] = {"metadata", "shard", "ratelimit", "proxy",
						"coordinator"};

/* Ports of one host; 0 = the [cluster] default. */
enum { P_META_WIRE, P_META_RAFT, P_SHARD_WIRE, P_PROXY_WIRE, P_PROXY_GRPC, P_RL_GRPC,
       P_HTTP_META, P_HTTP_SHARD, P_HTTP_RL, P_HTTP_PROXY, P_HTTP_COORD, P_SHARD_RAFT,
       P__COUNT };

static const struct {
	const char *key;
	int def;
} port_def[P__COUNT] = {
	{"metadata-port", 27019},    {"raft-port", 27029},	   {"shard-port", 27018},
	{"proxy-port", 27017},	     {"proxy-grpc-port", 1052},	   {"ratelimit-port", 1051},
	{"metadata-http-port", 9101}, {"shard-http-port", 9102},   {"ratelimit-http-port", 9105},
	{"proxy-http-port", 9103},   {"coordinator-http-port", 9104},
	{"shard-raft-port", 27039},
};

/* The HTTP port key of each role. */
static const int role_http[R__COUNT] = {P_HTTP_META, P_HTTP_SHARD, P_HTTP_RL, P_HTTP_PROXY,
					P_HTTP_COORD};

typedef struct cl_host {
	char name[64];
	char addr[128];
	unsigned roles; /* bit per R_* */
	int meta_id;    /* metadata: Raft id (0 = by order) */
	char shard_name[64];
	int shard_id;   /* shard: member id in its replica set (0 = by order) */
	char data_dir[CL_PATH];
	int port[P__COUNT];
	int port_line[P__COUNT]; /* spec line of each port key (0 = not set here) */
	int addr_line;
} cl_host;

typedef struct cl_spec {
	char path[CL_PATH];
	char ssh_user[64];
	char ssh_identity[PATH_MAX];
	int ssh_port;
	char *ssh_opts[CL_MAX_SSH_OPTS];
	int n_ssh_opts;
	char binary[CL_PATH];
	int launcher_systemd;
	char data_dir[CL_PATH];
	char config[CL_PATH];    /* remote config path ("" = launcher default) */
	char key_file[PATH_MAX]; /* local cluster key ("" = none) */
	char auth[16];           /* the proxies' --auth ("" = their default, auto) */
	char remote_key[CL_PATH];
	char log_level[16];
	int timeout_ms;
	int port[P__COUNT];
	int port_line[P__COUNT];
	cl_host hosts[CL_MAX_HOSTS];
	int n_hosts;
	struct {
		char name[64];
		char uri[512];
	} ext[CL_MAX_EXT];
	int n_ext;
	char err[768];
	int lineno;
	FILE *f; /* while parsing */
} cl_spec;

static int verbose;

/* bootstrap: hosts whose config could not be written or whose role could not be started
 * over SSH (one stderr line each, at the time): the later steps skip them and the run
 * exits 1 at the end, after repairing every other host. Indexed like cl_spec.hosts. */
static int host_failed[CL_MAX_HOSTS];


/* --- validation: every string that reaches a remote shell passes one of these --- */

static int only_chars(const char *s, const char *extra)
{
	if (s[0] == '\0' || s[0] == '-') {
		return 0;
	}
	for (const char *p = s; *p; p++) {
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		      strchr(extra, *p) != NULL)) {
			return 0;
		}
	}
	return 1;
}

static int valid_name(const char *s)
{
	return strlen(s) < 64 && only_chars(s, "._-");
}

static int valid_addr(const char *s)
{
	return strlen(s) < 128 && only_chars(s, ".-");
}

static int valid_path(const char *s)
{
	return s[0] == '/' && strlen(s) < CL_PATH && strstr(s, "..") == NULL &&
	       only_chars(s + 1, "._/+-");
}

static int parse_port(const char *v)
{
	char *end;
	long p = strtol(v, &end, 10);

	return *end == '\0' && p > 0 && p < 65536 ? (int)p : -1;
}

static int role_index(const char *r)
{
	for (int i = 0; i < R__COUNT; i++) {
		if (strcmp(role_name[i], r) == 0) {
			return i;
		}
	}
	return -1;
}

/* --- the spec --- */

static int spec_fail(cl_spec *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int spec_fail(cl_spec *s, const char *fmt, ...)
{
	va_list ap;
	char msg[400];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (s->err[0] == '\0') {
		snprintf(s->err, sizeof s->err, "%s:%d: %s", s->path, s->lineno, msg);
	}
	return 0; /* inih: stop */
}

static int port_key(const char *name)
{
	for (int i = 0; i < P__COUNT; i++) {
		if (strcmp(port_def[i].key, name) == 0) {
			return i;
		}
	}
	return -1;
}

static cl_host *host_for(cl_spec *s, const char *section)
{
	for (int i = 0; i < s->n_hosts; i++) {
		if (strcmp(s->hosts[i].name, section) == 0) {
			return &s->hosts[i];
		}
	}
	if (s->n_hosts == CL_MAX_HOSTS || !valid_name(section)) {
		return NULL;
	}
	cl_host *h = &s->hosts[s->n_hosts++];
	memset(h, 0, sizeof *h);
	snprintf(h->name, sizeof h->name, "%s", section);
	return h;
}

static int spec_cluster_key(cl_spec *s, const char *name, const char *v)
{
	int pk = port_key(name);

	if (pk >= 0) {
		if ((s->port[pk] = parse_port(v)) < 0) {
			return spec_fail(s, "%s: '%s' is not a port", name, v);
		}
		s->port_line[pk] = s->lineno;
	} else if (strcmp(name, "ssh-user") == 0) {
		if (!valid_name(v)) {
			return spec_fail(s, "ssh-user: '%s' is not a user name", v);
		}
		snprintf(s->ssh_user, sizeof s->ssh_user, "%s", v);
	} else if (strcmp(name, "ssh-identity") == 0) {
		snprintf(s->ssh_identity, sizeof s->ssh_identity, "%s", v);
	} else if (strcmp(name, "ssh-port") == 0) {
		if ((s->ssh_port = parse_port(v)) < 0) {
			return spec_fail(s, "ssh-port: '%s' is not a port", v);
		}
	} else if (strcmp(name, "ssh-option") == 0) {
		if (s->n_ssh_opts == CL_MAX_SSH_OPTS || strchr(v, '=') == NULL || v[0] == '-') {
			return spec_fail(s, "ssh-option: '%s' is not KEY=VALUE (or too many)", v);
		}
		s->ssh_opts[s->n_ssh_opts++] = sdb_strdup(v);
	} else if (strcmp(name, "binary") == 0 || strcmp(name, "data-dir") == 0 ||
		   strcmp(name, "config") == 0 || strcmp(name, "remote-key-file") == 0) {
		char *dst = name[0] == 'b' ? s->binary : name[0] == 'd' ? s->data_dir
			    : name[0] == 'c'				    ? s->config
									    : s->remote_key;
		if (!valid_path(v)) {
			return spec_fail(s, "%s: '%s' is not an absolute path of [A-Za-z0-9._/+-]", name, v);
		}
		snprintf(dst, CL_PATH, "%s", v);
	} else if (strcmp(name, "launcher") == 0) {
		if (strcmp(v, "systemd") != 0 && strcmp(v, "direct") != 0) {
			return spec_fail(s, "launcher: '%s' is not systemd or direct", v);
		}
		s->launcher_systemd = strcmp(v, "systemd") == 0;
	} else if (strcmp(name, "cluster-key-file") == 0) {
		snprintf(s->key_file, sizeof s->key_file, "%s", v);
	} else if (strcmp(name, "auth") == 0) {
		if (strcmp(v, "auto") != 0 && strcmp(v, "enabled") != 0 && strcmp(v, "disabled") != 0) {
			return spec_fail(s, "auth: '%s' is not auto, enabled or disabled", v);
		}
		snprintf(s->auth, sizeof s->auth, "%s", v);
	} else if (strcmp(name, "log-level") == 0) {
		if (strcmp(v, "debug") != 0 && strcmp(v, "info") != 0 && strcmp(v, "warn") != 0 &&
		    strcmp(v, "error") != 0) {
			return spec_fail(s, "log-level: '%s' is not debug, info, warn or error", v);
		}
		snprintf(s->log_level, sizeof s->log_level, "%s", v);
	} else if (strcmp(name, "timeout-ms") == 0) {
		char *end;
		long t = strtol(v, &end, 10);
		if (*end != '\0' || t <= 0 || t > 3600000) {
			return spec_fail(s, "timeout-ms: '%s' is not a positive integer", v);
		}
		s->timeout_ms = (int)t;
	} else {
		return spec_fail(s, "unknown key '%s' in [cluster]", name);
	}
	return 1;
}

static int spec_host_key(cl_spec *s, cl_host *h, const char *name, const char *v)
{
	int pk = port_key(name);

	if (pk >= 0) {
		if ((h->port[pk] = parse_port(v)) < 0) {
			return spec_fail(s, "%s: '%s' is not a port", name, v);
		}
		h->port_line[pk] = s->lineno;
	} else if (strcmp(name, "address") == 0) {
		if (!valid_addr(v)) {
			return spec_fail(s, "address: '%s' is not a host name or IPv4 address", v);
		}
		snprintf(h->addr, sizeof h->addr, "%s", v);
		h->addr_line = s->lineno;
	} else if (strcmp(name, "roles") == 0) {
		char *copy = sdb_strdup(v), *save = NULL;
		int bad = 0;
		h->roles = 0;
		for (char *t = strtok_r(copy, ", ", &save); t != NULL; t = strtok_r(NULL, ", ", &save)) {
			int r = role_index(t);
			if (r < 0) {
				spec_fail(s, "roles: unknown role '%s' (metadata, shard, proxy, coordinator, "
					     "ratelimit)", t);
				bad = 1;
				break;
			}
			h->roles |= 1u << r;
		}
		free(copy);
		if (bad) {
			return 0;
		}
	} else if (strcmp(name, "metadata-id") == 0) {
		char *end;
		long id = strtol(v, &end, 10);
		if (*end != '\0' || id <= 0 || id > 1000000) {
			return spec_fail(s, "metadata-id: '%s' is not a positive integer", v);
		}
		h->meta_id = (int)id;
	} else if (strcmp(name, "shard-member-id") == 0) {
		char *end;
		long id = strtol(v, &end, 10);
		if (*end != '\0' || id <= 0 || id > 1000000) {
			return spec_fail(s, "shard-member-id: '%s' is not a positive integer", v);
		}
		h->shard_id = (int)id;
	} else if (strcmp(name, "shard-name") == 0) {
		if (!valid_name(v)) {
			return spec_fail(s, "shard-name: '%s' is not a name of [A-Za-z0-9._-]", v);
		}
		snprintf(h->shard_name, sizeof h->shard_name, "%s", v);
	} else if (strcmp(name, "data-dir") == 0) {
		if (!valid_path(v)) {
			return spec_fail(s, "data-dir: '%s' is not an absolute path of [A-Za-z0-9._/+-]", v);
		}
		snprintf(h->data_dir, sizeof h->data_dir, "%s", v);
	} else {
		return spec_fail(s, "unknown key '%s' in host section [%s]", name, h->name);
	}
	return 1;
}

static int spec_cb(void *user, const char *section, const char *name, const char *value)
{
	cl_spec *s = user;

	if (s->err[0] != '\0') {
		return 0;
	}
	if (section == NULL || section[0] == '\0') {
		return spec_fail(s, "key '%s' outside a section", name);
	}
	if (strchr(value, '\n') != NULL) {
		return spec_fail(s, "%s: multi-line values are not allowed", name);
	}
	if (strcmp(section, "cluster") == 0) {
		return spec_cluster_key(s, name, value);
	}
	if (strcmp(section, "external-shards") == 0) {
		if (s->n_ext == CL_MAX_EXT || !valid_name(name) || strncmp(value, "mongodb://", 10) != 0 ||
		    strlen(value) >= sizeof s->ext[0].uri) {
			return spec_fail(s, "external shard '%s': want NAME = mongodb://... (at most %d)",
					 name, CL_MAX_EXT);
		}
		snprintf(s->ext[s->n_ext].name, sizeof s->ext[0].name, "%s", name);
		snprintf(s->ext[s->n_ext].uri, sizeof s->ext[0].uri, "%s", value);
		s->n_ext++;
		return 1;
	}
	cl_host *h = host_for(s, section);
	if (h == NULL) {
		return spec_fail(s, "host section [%s]: not a name of [A-Za-z0-9._-] (or more than %d "
				    "hosts)", section, CL_MAX_HOSTS);
	}
	return spec_host_key(s, h, name, value);
}

/* inih reader that counts lines for error messages (Debian's inih has no
 * INI_HANDLER_LINENO; as src/common/config.c). */
static char *spec_reader(char *str, int num, void *stream)
{
	cl_spec *s = stream;
	char *r = fgets(str, num, s->f);

	if (r != NULL) {
		s->lineno++;
	}
	return r;
}

static int port_of(const cl_spec *s, const cl_host *h, int p)
{
	return h->port[p] != 0 ? h->port[p] : s->port[p] != 0 ? s->port[p] : port_def[p].def;
}

/* The ports each role listens on (-1 ends a list). */
static const int role_ports[R__COUNT][4] = {
	{P_META_WIRE, P_META_RAFT, P_HTTP_META, -1}, {P_SHARD_WIRE, P_SHARD_RAFT, P_HTTP_SHARD, -1},
	{P_RL_GRPC, P_HTTP_RL, -1, -1}, {P_PROXY_WIRE, P_PROXY_GRPC, P_HTTP_PROXY, -1},
	{P_HTTP_COORD, -1, -1, -1},
};

/* The spec line that set port key p of h (the host's key, else [cluster]'s; 0 = default). */
static int port_line(const cl_spec *s, const cl_host *h, int p)
{
	return h->port[p] != 0 ? h->port_line[p] : s->port[p] != 0 ? s->port_line[p] : 0;
}

/* Every listener of a host (all ports of all its roles) on its own port: else a message
 * "FILE:LINE: host H: port N used twice (KEY, KEY)" in err and -1. */
static int check_host_ports(const cl_spec *s, const cl_host *h, char *err, size_t errlen)
{
	int used[P__COUNT], n = 0;

	for (int r = 0; r < R__COUNT; r++) {
		if (!(h->roles & (1u << r))) {
			continue;
		}
		for (int k = 0; k < 4 && role_ports[r][k] >= 0; k++) {
			used[n++] = role_ports[r][k];
		}
	}
	for (int a = 0; a < n; a++) {
		for (int b = a + 1; b < n; b++) {
			int pa = used[a] < used[b] ? used[a] : used[b];
			int pb = used[a] < used[b] ? used[b] : used[a];
			int la, lb;
			if (port_of(s, h, pa) != port_of(s, h, pb)) {
				continue;
			}
			la = port_line(s, h, pa);
			lb = port_line(s, h, pb);
			snprintf(err, errlen, "%s:%d: host %s: port %d used twice (%s, %s)", s->path,
				 la > lb ? la : lb, h->name, port_of(s, h, pa), port_def[pa].key,
				 port_def[pb].key);
			return -1;
		}
	}
	return 0;
}

static void free_spec(cl_spec *s)
{
	for (int i = 0; i < s->n_ssh_opts; i++) {
		free(s->ssh_opts[i]);
	}
	s->n_ssh_opts = 0;
}

/* Load and check path into *s; 0 or -1 with a message on stderr. */
static int load_spec(const char *path, cl_spec *s)
{
	FILE *f;
	int rc, next_id = 1, n_meta = 0;

	memset(s, 0, sizeof *s);
	snprintf(s->path, sizeof s->path, "%.*s", (int)sizeof s->path - 1, path);
	snprintf(s->ssh_user, sizeof s->ssh_user, "root");
	snprintf(s->binary, sizeof s->binary, "/usr/bin/stripedb");
	snprintf(s->data_dir, sizeof s->data_dir, "/var/lib/stripedb");
	snprintf(s->log_level, sizeof s->log_level, "info");
	s->launcher_systemd = 1;
	s->timeout_ms = 60000;
	f = fopen(path, "r");
	if (f == NULL) {
		fprintf(stderr, "stripedb ctl cluster: cannot read %s: %s\n", path, strerror(errno));
		return -1;
	}
	s->f = f;
	rc = ini_parse_stream(spec_reader, s, spec_cb, s);
	s->f = NULL;
	fclose(f);
	if (s->err[0] != '\0') {
		fprintf(stderr, "stripedb ctl cluster: %s\n", s->err);
		goto err;
	}
	if (rc != 0) {
		fprintf(stderr, "stripedb ctl cluster: %s:%d: syntax error\n", path, rc);
		goto err;
	}
	if (s->n_hosts == 0) {
		fprintf(stderr, "stripedb ctl cluster: %s: no host section\n", path);
		goto err;
	}
	if (s->config[0] == '\0' && s->launcher_systemd) {
		snprintf(s->config, sizeof s->config, "/etc/stripedb/stripedb.conf");
	}
	if (s->remote_key[0] == '\0' && s->launcher_systemd) {
		snprintf(s->remote_key, sizeof s->remote_key, "/etc/stripedb/cluster.key");
	}
	for (int i = 0; i < s->n_hosts; i++) {
		cl_host *h = &s->hosts[i];
		if (h->addr[0] == '\0' || h->roles == 0) {
			fprintf(stderr, "stripedb ctl cluster: %s: host [%s] needs address and roles\n", path,
				h->name);
			goto err;
		}
		if (h->data_dir[0] == '\0') {
			snprintf(h->data_dir, sizeof h->data_dir, "%s", s->data_dir);
		}
		if (h->shard_name[0] == '\0') {
			snprintf(h->shard_name, sizeof h->shard_name, "shard-%s", h->name);
		}
		if (h->roles & (1u << R_METADATA)) {
			n_meta++;
			if (h->meta_id >= next_id) {
				next_id = h->meta_id + 1;
			}
		}
	}
	if (n_meta == 0) {
		fprintf(stderr, "stripedb ctl cluster: %s: no host has the metadata role\n", path);
		goto err;
	}
	for (int i = 0; i < s->n_hosts; i++) {
		cl_host *h = &s->hosts[i];
		if ((h->roles & (1u << R_METADATA)) && h->meta_id == 0) {
			h->meta_id = next_id++;
		}
		for (int j = 0; j < i; j++) {
			if ((h->roles & s->hosts[j].roles & (1u << R_METADATA)) &&
			    h->meta_id == s->hosts[j].meta_id) {
				fprintf(stderr, "stripedb ctl cluster: %s: hosts [%s] and [%s] have metadata-id "
						"%d\n", path, s->hosts[j].name, h->name, h->meta_id);
				goto err;
			}
			/* hosts with the same shard-name are the members of one replica set */
			if ((h->roles & s->hosts[j].roles & (1u << R_SHARD)) &&
			    strcmp(h->shard_name, s->hosts[j].shard_name) == 0 && h->shard_id != 0 &&
			    h->shard_id == s->hosts[j].shard_id) {
				fprintf(stderr, "stripedb ctl cluster: %s: hosts [%s] and [%s] of shard %s have "
						"shard-member-id %d\n", path, s->hosts[j].name, h->name,
					h->shard_name, h->shard_id);
				goto err;
			}
			/* one section per machine: its roles share the host's config file, data
			 * dir and pid files */
			if (strcmp(h->addr, s->hosts[j].addr) == 0) {
				fprintf(stderr, "stripedb ctl cluster: %s:%d: hosts [%s] and [%s] have address "
						"%s (one section per host, with all its roles)\n", path,
					h->addr_line, s->hosts[j].name, h->name, h->addr);
				goto err;
			}
		}
		{
			char perr[sizeof s->err];
			if (check_host_ports(s, h, perr, sizeof perr) != 0) {
				fprintf(stderr, "stripedb ctl cluster: %s\n", perr);
				goto err;
			}
		}
	}
	/* shard replica sets: member ids by order where not given, 1, 3 or 5 members */
	for (int i = 0; i < s->n_hosts; i++) {
		cl_host *h = &s->hosts[i];
		int members = 0, next = 1;
		if (!(h->roles & (1u << R_SHARD))) {
			continue;
		}
		for (int j = 0; j < s->n_hosts; j++) {
			const cl_host *o = &s->hosts[j];
			if ((o->roles & (1u << R_SHARD)) && strcmp(o->shard_name, h->shard_name) == 0) {
				members++;
				if (o->shard_id >= next) {
					next = o->shard_id + 1;
				}
			}
		}
		if (members != 1 && members != 3 && members != 5) {
			fprintf(stderr, "stripedb ctl cluster: %s: shard %s has %d members (hosts with "
					"that shard-name): a replica set has 1, 3 or 5\n",
				path, h->shard_name, members);
			goto err;
		}
		if (h->shard_id == 0) {
			/* the first host without an id takes the next free one, in spec order */
			for (int j = 0; j < s->n_hosts; j++) {
				cl_host *o = &s->hosts[j];
				if ((o->roles & (1u << R_SHARD)) && strcmp(o->shard_name, h->shard_name) == 0 &&
				    o->shard_id == 0) {
					o->shard_id = next++;
				}
			}
		}
	}
	if (s->key_file[0] != '\0') {
		char kerr[300];
		if (auth_cluster_load(s->key_file, kerr, sizeof kerr) != 0) {
			fprintf(stderr, "stripedb ctl cluster: %s: cluster-key-file: %s\n", path, kerr);
			goto err;
		}
	}
	return 0;
err:
	free_spec(s);
	return -1;
}

/* Remote config path and key path of a host. */
static void host_config_path(const cl_spec *s, const cl_host *h, char *buf, size_t n)
{
	if (s->config[0] != '\0') {
		snprintf(buf, n, "%s", s->config);
	} else {
		snprintf(buf, n, "%s/stripedb.conf", h->data_dir);
	}
}

static void host_key_path(const cl_spec *s, const cl_host *h, char *buf, size_t n)
{
	if (s->remote_key[0] != '\0') {
		snprintf(buf, n, "%s", s->remote_key);
	} else {
		snprintf(buf, n, "%s/cluster.key", h->data_dir);
	}
}

/* --- a growable text buffer --- */

typedef struct sbuf {
	char *p;
	size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (b->len + (size_t)n + 1 > b->cap) {
		b->cap = (b->len + (size_t)n + 1) * 2;
		b->p = sdb_realloc(b->p, b->cap);
	}
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

/* "H:P,H:P" of the metadata wire addresses. */
static void metadata_list(const cl_spec *s, sbuf *b)
{
	int first = 1;

	for (int i = 0; i < s->n_hosts; i++) {
		const cl_host *h = &s->hosts[i];
		if (h->roles & (1u << R_METADATA)) {
			sb_printf(b, "%s%s:%d", first ? "" : ",", h->addr, port_of(s, h, P_META_WIRE));
			first = 0;
		}
	}
}

/* The config file of one host: global keys, then a section per role it runs. */
static char *host_config(const cl_spec *s, const cl_host *h)
{
	sbuf b = {0};
	char key[PATH_MAX];

	sb_printf(&b, "# %s: written by `stripedb ctl cluster bootstrap --spec %s` for host [%s].\n"
		      "# Re-running the bootstrap rewrites it; edit the spec instead.\n",
		  s->config[0] ? s->config : "stripedb.conf", s->path, h->name);
	sb_printf(&b, "log-level = %s\nmetadata = ", s->log_level);
	metadata_list(s, &b);
	sb_printf(&b, "\n");
	if (s->key_file[0] != '\0') {
		host_key_path(s, h, key, sizeof key);
		sb_printf(&b, "cluster-key-file = %s\n", key);
	}
	if (h->roles & (1u << R_METADATA)) {
		sb_printf(&b, "\n[metadata]\nnode-id = %d\ndata-dir = %s/metadata\nlisten = %s:%d\n"
			      "raft-listen = %s:%d\nhttp-listen = %s:%d\nbootstrap-members = ",
			  h->meta_id, h->data_dir, h->addr, port_of(s, h, P_META_WIRE), h->addr,
			  port_of(s, h, P_META_RAFT), h->addr, port_of(s, h, P_HTTP_META));
		for (int i = 0, first = 1; i < s->n_hosts; i++) {
			const cl_host *m = &s->hosts[i];
			if (m->roles & (1u << R_METADATA)) {
				sb_printf(&b, "%s%d@%s:%d", first ? "" : ",", m->meta_id, m->addr,
					  port_of(s, m, P_META_RAFT));
				first = 0;
			}
		}
		sb_printf(&b, "\n");
	}
	if (h->roles & (1u << R_SHARD)) {
		/* a member of the replica set of every host with this shard-name (issue #15) */
		sb_printf(&b, "\n[shard]\nreplica-set = %s\nnode-id = %d\ndata-dir = %s/shard\n"
			      "listen = %s:%d\nraft-listen = %s:%d\nhttp-listen = %s:%d\n"
			      "bootstrap-members = ",
			  h->shard_name, h->shard_id, h->data_dir, h->addr, port_of(s, h, P_SHARD_WIRE),
			  h->addr, port_of(s, h, P_SHARD_RAFT), h->addr, port_of(s, h, P_HTTP_SHARD));
		for (int i = 0, first = 1; i < s->n_hosts; i++) {
			const cl_host *m = &s->hosts[i];
			if ((m->roles & (1u << R_SHARD)) && strcmp(m->shard_name, h->shard_name) == 0) {
				sb_printf(&b, "%s%d@%s:%d", first ? "" : ",", m->shard_id, m->addr,
					  port_of(s, m, P_SHARD_RAFT));
				first = 0;
			}
		}
		sb_printf(&b, "\n");
	}
	if (h->roles & ((1u << R_RATELIMIT) | (1u << R_PROXY))) {
		/* the rate-limit peer ring: every rate limiter and every proxy (as `dev up`) */
		sbuf peers = {0};
		for (int i = 0; i < s->n_hosts; i++) {
			const cl_host *p = &s->hosts[i];
			if (p->roles & (1u << R_RATELIMIT)) {
				sb_printf(&peers, "%s%s:%d", peers.len ? "," : "", p->addr,
					  port_of(s, p, P_RL_GRPC));
			}
			if (p->roles & (1u << R_PROXY)) {
				sb_printf(&peers, "%s%s:%d", peers.len ? "," : "", p->addr,
					  port_of(s, p, P_PROXY_GRPC));
			}
		}
		if (h->roles & (1u << R_RATELIMIT)) {
			sb_printf(&b, "\n[ratelimit]\nnode-id = ratelimit-%s\nhttp-listen = %s:%d\n"
				      "grpc-listen = %s:%d\npeers = %s\n",
				  h->name, h->addr, port_of(s, h, P_HTTP_RL), h->addr,
				  port_of(s, h, P_RL_GRPC), peers.p);
		}
		if (h->roles & (1u << R_PROXY)) {
			sb_printf(&b, "\n[proxy]\nnode-id = proxy-%s\nlisten = %s:%d\nhttp-listen = %s:%d\n"
				      "grpc-listen = %s:%d\npeers = %s\n",
				  h->name, h->addr, port_of(s, h, P_PROXY_WIRE), h->addr,
				  port_of(s, h, P_HTTP_PROXY), h->addr, port_of(s, h, P_PROXY_GRPC),
				  peers.p);
			if (s->auth[0] != '\0')
				sb_printf(&b, "auth = %s\n", s->auth);
		}
		free(peers.p);
	}
	if (h->roles & (1u << R_COORDINATOR)) {
		sb_printf(&b, "\n[coordinator]\nnode-id = coordinator-%s\nhttp-listen = %s:%d\n"
			      "cdc = embedded:%s/cdc\narchive = file:%s/archive\n",
			  h->name, h->addr, port_of(s, h, P_HTTP_COORD), h->data_dir, h->data_dir);
	}
	return b.p;
}

/* --- ssh --- */

/* One `ssh HOST CMD` in flight: several run at once (one per host), each with stdin from a
 * temporary file and its stdout and stderr captured in others (no pipe to keep drained). */
typedef struct ssh_job {
	const cl_host *h;
	pid_t pid; /* 0: not started (err says why) */
	FILE *fin, *fout, *ferr;
	char err[256];
} ssh_job;

static void ssh_job_close(ssh_job *j)
{
	FILE **fs[3] = {&j->fin, &j->fout, &j->ferr};

	for (int k = 0; k < 3; k++) {
		if (*fs[k] != NULL) {
			fclose(*fs[k]);
			*fs[k] = NULL;
		}
	}
}

/* Start `ssh HOST CMD` with stdin from in (len bytes, may be NULL). Returns 0, or -1 with
 * the reason in j->err (then ssh_finish reports it). */
static int ssh_start(const cl_spec *s, const cl_host *h, const char *cmd, const char *in,
		     size_t len, ssh_job *j)
{
	char *argv[16 + 2 * CL_MAX_SSH_OPTS];
	char port[16];
	int argc = 0;

	memset(j, 0, sizeof *j);
	j->h = h;
	j->fin = tmpfile();
	j->fout = tmpfile();
	j->ferr = tmpfile();
	if (j->fin == NULL || j->fout == NULL || j->ferr == NULL ||
	    (in != NULL && (fwrite(in, 1, len, j->fin) != len || fflush(j->fin) != 0))) {
		snprintf(j->err, sizeof j->err, "tmpfile: %s", strerror(errno));
		ssh_job_close(j);
		return -1;
	}
	rewind(j->fin);
	snprintf(port, sizeof port, "%d", s->ssh_port > 0 ? s->ssh_port : 22);
	argv[argc++] = "ssh";
	argv[argc++] = "-o";
	argv[argc++] = "BatchMode=yes";
	argv[argc++] = "-o";
	argv[argc++] = "ConnectTimeout=10";
	argv[argc++] = "-p";
	argv[argc++] = port;
	argv[argc++] = "-l";
	argv[argc++] = (char *)s->ssh_user;
	if (s->ssh_identity[0] != '\0') {
		argv[argc++] = "-i";
		argv[argc++] = (char *)s->ssh_identity;
	}
	for (int i = 0; i < s->n_ssh_opts; i++) {
		argv[argc++] = "-o";
		argv[argc++] = s->ssh_opts[i];
	}
	argv[argc++] = "--";
	argv[argc++] = (char *)h->addr;
	argv[argc++] = (char *)cmd;
	argv[argc] = NULL;
	if (verbose) {
		fprintf(stderr, "+ ssh %s %s\n", h->addr, cmd);
	}
	fflush(stdout);
	fflush(stderr);
	j->pid = fork();
	if (j->pid < 0) {
		j->pid = 0;
		snprintf(j->err, sizeof j->err, "fork: %s", strerror(errno));
		ssh_job_close(j);
		return -1;
	}
	if (j->pid == 0) {
		dup2(fileno(j->fin), 0);
		dup2(fileno(j->fout), 1);
		dup2(fileno(j->ferr), 2);
		execvp("ssh", argv);
		fprintf(stderr, "exec ssh: %s\n", strerror(errno));
		_exit(127);
	}
	return 0;
}

/* Wait for a job started by ssh_start (at most CL_SSH_TIMEOUT_MS after deadline_base, then
 * SIGKILL). Returns the exit status (255: ssh itself failed), -1 when it could not run or
 * timed out; out gets the first line of stdout on success, of stderr on failure. */
static int ssh_finish(ssh_job *j, uint64_t deadline, char *out, size_t outlen)
{
	int status = 0, rc = -1;
	char line[512] = "";

	out[0] = '\0';
	if (j->pid == 0) {
		snprintf(out, outlen, "%s", j->err);
		return -1;
	}
	for (;;) {
		pid_t w = waitpid(j->pid, &status, WNOHANG);
		if (w == j->pid) {
			break;
		}
		if (w < 0 && errno != EINTR) {
			snprintf(out, outlen, "waitpid: %s", strerror(errno));
			goto done;
		}
		if (sdb_mono_ms() > deadline) {
			kill(j->pid, SIGKILL);
			waitpid(j->pid, &status, 0);
			snprintf(out, outlen, "ssh timed out after %d s", CL_SSH_TIMEOUT_MS / 1000);
			goto done;
		}
		sdb_sleep_ms(10);
	}
	rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	rewind(rc == 0 ? j->fout : j->ferr);
	if (fgets(line, sizeof line, rc == 0 ? j->fout : j->ferr) == NULL) {
		line[0] = '\0';
	}
	line[strcspn(line, "\r\n")] = '\0';
	snprintf(out, outlen, "%s", line);
done:
	j->pid = 0;
	ssh_job_close(j);
	return rc;
}

/* --- network checks --- */

static long http_status(const char *addr, int port, const char *path)
{
	char url[256];
	CURL *c = curl_easy_init();
	long code = 0;
	FILE *sink = fopen("/dev/null", "w");

	if (c == NULL || sink == NULL) {
		goto done;
	}
	snprintf(url, sizeof url, "http://%s:%d%s", addr, port, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 2000L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
	if (curl_easy_perform(c) == CURLE_OK) {
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
	}
done:
	if (c != NULL) {
		curl_easy_cleanup(c);
	}
	if (sink != NULL) {
		fclose(sink);
	}
	return code;
}

static int role_healthy(const cl_spec *s, const cl_host *h, int r)
{
	return http_status(h->addr, port_of(s, h, role_http[r]), "/healthz") == 200;
}

/* hello on one metadata member: 1 leader, 0 not (or unreachable). */
static int member_leads(const cl_spec *s, const cl_host *h)
{
	char uri[256];
	mongoc_client_t *cl;
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it;
	int leader = 0;

	snprintf(uri, sizeof uri,
		 "mongodb://%s:%d/?directConnection=true&serverSelectionTimeoutMS=2000"
		 "&connectTimeoutMS=2000",
		 h->addr, port_of(s, h, P_META_WIRE));
	cl = auth_cluster_client_new(uri);
	if (cl == NULL) {
		return 0;
	}
	BSON_APPEND_INT32(&cmd, "hello", 1);
	if (mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e)) {
		leader = bson_iter_init_find(&it, &reply, "isWritablePrimary") && bson_iter_as_bool(&it);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(cl);
	return leader;
}

static const cl_host *find_leader(const cl_spec *s)
{
	for (int i = 0; i < s->n_hosts; i++) {
		if ((s->hosts[i].roles & (1u << R_METADATA)) && member_leads(s, &s->hosts[i])) {
			return &s->hosts[i];
		}
	}
	return NULL;
}

/* --- bootstrap steps --- */

static void quote(sbuf *b, const char *tok)
{
	/* tokens are validated (no quote, no space); quoting keeps the shell from globbing */
	sb_printf(b, " '%s'", tok);
}

static int fail(const cl_host *h, const char *what, const char *msg)
{
	fprintf(stderr, "stripedb ctl cluster bootstrap: host %s (%s) %s: %s\n", h->name, h->addr,
		what, msg);
	return -1;
}

/* Write every host's config file (and the cluster key): one `agent put` per host, all
 * hosts at once. A host that fails is named on stderr and marked in host_failed; -1 only
 * when the cluster key cannot be read (nothing was sent). */
static int configure_all(const cl_spec *s)
{
	static ssh_job jobs[CL_MAX_HOSTS];
	static char keybuf[AUTH_CLUSTER_KEYS_MAX * 4200]; /* a key file of several keys */
	size_t keylen = 0;
	uint64_t deadline;
	int rc = 0;

	if (s->key_file[0] != '\0') {
		FILE *f = fopen(s->key_file, "r");
		if (f == NULL) {
			fprintf(stderr, "stripedb ctl cluster bootstrap: %s: %s\n", s->key_file,
				strerror(errno));
			return -1;
		}
		/* auth_cluster_load checked it: at most AUTH_CLUSTER_KEYS_MAX keys of 1024 base64
		 * characters, whitespace and YAML list syntax */
		keylen = fread(keybuf, 1, sizeof keybuf, f);
		fclose(f);
	}
	for (int i = 0; i < s->n_hosts; i++) {
		const cl_host *h = &s->hosts[i];
		char path[PATH_MAX], key[PATH_MAX];
		char *conf = host_config(s, h);
		sbuf cmd = {0}, in = {0};
		host_config_path(s, h, path, sizeof path);
		quote(&cmd, s->binary);
		sb_printf(&cmd, " ctl cluster agent put");
		quote(&cmd, path);
		sb_printf(&cmd, " 0644 - %zu", strlen(conf));
		sb_printf(&in, "%s", conf);
		free(conf);
		if (keylen > 0) {
			host_key_path(s, h, key, sizeof key);
			quote(&cmd, key);
			sb_printf(&cmd, " 0600 %s %zu", s->launcher_systemd ? "stripedb" : "-", keylen);
			sb_printf(&in, "%.*s", (int)keylen, keybuf);
		}
		ssh_start(s, h, cmd.p + 1, in.p, in.len, &jobs[i]);
		memset(in.p, 0, in.len);
		free(in.p);
		free(cmd.p);
	}
	memset(keybuf, 0, sizeof keybuf);
	deadline = sdb_mono_ms() + CL_SSH_TIMEOUT_MS;
	for (int i = 0; i < s->n_hosts; i++) {
		char out[512];
		if (ssh_finish(&jobs[i], deadline, out, sizeof out) != 0) {
			/* this host is skipped from here on; the others go on */
			fail(&s->hosts[i], "writing the config", out[0] ? out : "ssh failed");
			host_failed[i] = 1;
		} else if (verbose) {
			printf("%-12s %s\n", s->hosts[i].name, out);
		}
	}
	return rc;
}

static int wait_role(const cl_spec *s, const cl_host *h, int r)
{
	uint64_t deadline = sdb_mono_ms() + (uint64_t)s->timeout_ms;
	char what[64], msg[512];

	while (sdb_mono_ms() < deadline) {
		if (role_healthy(s, h, r)) {
			return 0;
		}
		sdb_sleep_ms(100);
	}
	snprintf(what, sizeof what, "role %s", role_name[r]);
	if (s->launcher_systemd) {
		snprintf(msg, sizeof msg, "no healthy /healthz on port %d after %d s (journalctl -u "
					  "stripedb@%s)", port_of(s, h, role_http[r]), s->timeout_ms / 1000,
			 role_name[r]);
	} else {
		snprintf(msg, sizeof msg, "no healthy /healthz on port %d after %d s (see %s/logs/%s.log)",
			 port_of(s, h, role_http[r]), s->timeout_ms / 1000, h->data_dir, role_name[r]);
	}
	return fail(h, what, msg);
}

/* Start every instance of role r that does not answer /healthz (all hosts at once, but
 * those in host_failed), then wait for each to be healthy. A host whose start fails over
 * SSH joins host_failed; -1 when a started role does not become healthy. */
static int bring_up(const cl_spec *s, int r)
{
	static ssh_job jobs[CL_MAX_HOSTS];
	int started[CL_MAX_HOSTS] = {0};
	uint64_t deadline;
	int rc = 0;

	for (int i = 0; i < s->n_hosts; i++) {
		const cl_host *h = &s->hosts[i];
		sbuf cmd = {0};
		if (!(h->roles & (1u << r))) {
			continue;
		}
		if (host_failed[i]) {
			printf("%-12s %-12s skipped (the host failed)\n", h->name, role_name[r]);
			continue;
		}
		if (role_healthy(s, h, r)) {
			printf("%-12s %-12s already healthy\n", h->name, role_name[r]);
			continue;
		}
		if (s->launcher_systemd) {
			sb_printf(&cmd, " systemctl enable --now 'stripedb@%s'", role_name[r]);
		} else {
			char conf[PATH_MAX];
			host_config_path(s, h, conf, sizeof conf);
			quote(&cmd, s->binary);
			sb_printf(&cmd, " ctl cluster agent start %s", role_name[r]);
			quote(&cmd, conf);
			quote(&cmd, h->data_dir);
		}
		ssh_start(s, h, cmd.p + 1, NULL, 0, &jobs[i]);
		started[i] = 1;
		free(cmd.p);
	}
	deadline = sdb_mono_ms() + CL_SSH_TIMEOUT_MS;
	for (int i = 0; i < s->n_hosts; i++) {
		char out[512], what[64];
		if (!started[i]) {
			continue;
		}
		snprintf(what, sizeof what, "role %s", role_name[r]);
		if (ssh_finish(&jobs[i], deadline, out, sizeof out) != 0) {
			/* skipped from here on; the other hosts go on */
			fail(&s->hosts[i], what, out[0] ? out : "ssh failed");
			host_failed[i] = 1;
		} else {
			printf("%-12s %-12s %s\n", s->hosts[i].name, role_name[r], out[0] ? out : "started");
		}
	}
	for (int i = 0; i < s->n_hosts && rc == 0; i++) {
		if ((s->hosts[i].roles & (1u << r)) && !host_failed[i] &&
		    wait_role(s, &s->hosts[i], r) != 0) {
			rc = -1;
		}
	}
	return rc;
}

static int wait_leader(const cl_spec *s, const cl_host **leader)
{
	uint64_t deadline = sdb_mono_ms() + (uint64_t)s->timeout_ms;

	while (sdb_mono_ms() < deadline) {
		if ((*leader = find_leader(s)) != NULL) {
			return 0;
		}
		sdb_sleep_ms(100);
	}
	fprintf(stderr, "stripedb ctl cluster bootstrap: the metadata group elected no leader in %d s\n",
		s->timeout_ms / 1000);
	return -1;
}

/* The URI bootstrap registers the embedded shard of h with: the replica-set URI of every
 * host with h's shard-name, in spec order. */
static void shard_uri(const cl_spec *s, const cl_host *h, char *buf, size_t n)
{
	size_t o = (size_t)snprintf(buf, n, "mongodb://");
	for (int i = 0, first = 1; i < s->n_hosts && o < n; i++) {
		const cl_host *m = &s->hosts[i];
		if ((m->roles & (1u << R_SHARD)) && strcmp(m->shard_name, h->shard_name) == 0) {
			o += (size_t)snprintf(buf + o, n - o, "%s%s:%d", first ? "" : ",", m->addr,
					      port_of(s, m, P_SHARD_WIRE));
			first = 0;
		}
	}
	if (o < n) {
		snprintf(buf + o, n - o, "/?replicaSet=%s", h->shard_name);
	}
}

/* Whether an earlier host of the spec is a member of h's shard (one registration per set). */
static int shard_seen(const cl_spec *s, const cl_host *h)
{
	for (const cl_host *o = s->hosts; o < h; o++) {
		if ((o->roles & (1u << R_SHARD)) && strcmp(o->shard_name, h->shard_name) == 0) {
			return 1;
		}
	}
	return 0;
}

/* A client of the metadata group (the replica set of its members); NULL on bad addresses. */
static mongoc_client_t *meta_client(const cl_spec *s)
{
	sbuf uri = {0};
	mongoc_client_t *cl;

	sb_printf(&uri, "mongodb://");
	metadata_list(s, &uri);
	sb_printf(&uri, "/?replicaSet=stripedb-meta&serverSelectionTimeoutMS=5000");
	cl = auth_cluster_client_new(uri.p);
	free(uri.p);
	return cl;
}

/* The URI shard name is registered with (listShards: {shards: [{id|_id, uri|host}]}, as
 * proxy_load_shards reads it) into uri. 1 found, 0 not registered, -1 listShards failed
 * (reason in err). */
static int registered_uri(mongoc_client_t *cl, const char *name, char *uri, size_t n, char *err,
			  size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it, arr, sh;
	int found = 0;

	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (!mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e)) {
		snprintf(err, errlen, "listShards: %s", e.message);
		bson_destroy(&reply);
		bson_destroy(&cmd);
		return -1;
	}
	if (bson_iter_init_find(&it, &reply, "shards") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (!found && bson_iter_next(&arr)) {
			const char *id = NULL, *u = NULL;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &sh)) {
				continue;
			}
			while (bson_iter_next(&sh)) {
				const char *k = bson_iter_key(&sh);
				if (!BSON_ITER_HOLDS_UTF8(&sh)) {
					continue;
				}
				if (strcmp(k, "id") == 0 || strcmp(k, "_id") == 0) {
					id = bson_iter_utf8(&sh, NULL);
				} else if (strcmp(k, "uri") == 0 || strcmp(k, "host") == 0) {
					u = bson_iter_utf8(&sh, NULL);
				}
			}
			if (id != NULL && u != NULL && strcmp(id, name) == 0) {
				snprintf(uri, n, "%s", u);
				found = 1;
			}
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return found;
}

/* The one-line complaint about shard name registered at reg while the spec says want. */
static void mismatch_msg(char *buf, size_t n, const char *name, const char *reg, const char *want)
{
	snprintf(buf, n, "shard %s is registered at %s but the spec says %s (bootstrap does not "
			 "move a registered shard: put the old address back in the spec, or move the "
			 "shard by hand)", name, reg, want);
}

/* addShard NAME URI on the metadata group; an existing name (11000) is fine when it is
 * registered with this URI (listShards), an error otherwise. */
static int add_shard(const cl_spec *s, const char *name, const char *shard_uri, const cl_host *h)
{
	mongoc_client_t *cl;
	uint64_t deadline = sdb_mono_ms() + (uint64_t)s->timeout_ms;
	int rc = -1;

	cl = meta_client(s);
	if (cl == NULL) {
		fprintf(stderr, "stripedb ctl cluster bootstrap: bad metadata addresses\n");
		return -1;
	}
	for (;;) {
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		bool ok;
		BSON_APPEND_UTF8(&cmd, "addShard", name);
		BSON_APPEND_UTF8(&cmd, "uri", shard_uri);
		ok = mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e);
		bson_destroy(&reply);
		bson_destroy(&cmd);
		if (!ok && e.code == 11000) {
			char reg[512], msg[1400];
			int f = registered_uri(cl, name, reg, sizeof reg, msg, sizeof msg);
			if (f == 1 && strcmp(reg, shard_uri) != 0) {
				mismatch_msg(msg, sizeof msg, name, reg, shard_uri);
			}
			if (f != 1 || strcmp(reg, shard_uri) != 0) {
				if (f == 0) {
					snprintf(msg, sizeof msg, "addShard says %s exists, listShards does "
								  "not list it", name);
				}
				if (h != NULL) {
					fail(h, "addShard", msg);
				} else {
					fprintf(stderr, "stripedb ctl cluster bootstrap: external shard %s: %s\n",
						name, msg);
				}
				break;
			}
		}
		if (ok || e.code == 11000) {
			printf("%-12s %-12s %s %s\n", h != NULL ? h->name : "-", name,
			       ok ? "registered" : "already registered", shard_uri);
			rc = 0;
			break;
		}
		if (sdb_mono_ms() > deadline) {
			if (h != NULL) {
				fail(h, "addShard", e.message);
			} else {
				fprintf(stderr, "stripedb ctl cluster bootstrap: external shard %s: addShard: "
						"%s\n", name, e.message);
			}
			break;
		}
		sdb_sleep_ms(200); /* a leader change: retry within the deadline */
	}
	mongoc_client_destroy(cl);
	return rc;
}

static int cluster_bootstrap(const cl_spec *s)
{
	const cl_host *leader = NULL;

	int n_meta = 0, n_meta_failed = 0, n_failed = 0;

	if (configure_all(s) != 0) {
		return 1;
	}
	if (bring_up(s, R_METADATA) != 0) {
		return 1;
	}
	for (int i = 0; i < s->n_hosts; i++) {
		if (s->hosts[i].roles & (1u << R_METADATA)) {
			n_meta++;
			n_meta_failed += host_failed[i];
		}
	}
	if (n_meta_failed == n_meta) {
		return 1; /* no member to wait for: each failed host has its line */
	}
	if (wait_leader(s, &leader) != 0) {
		return 1;
	}
	printf("%-12s %-12s leader (id %d)\n", leader->name, "metadata", leader->meta_id);
	if (bring_up(s, R_SHARD) != 0) {
		return 1;
	}
	for (int i = 0; i < s->n_hosts; i++) {
		const cl_host *h = &s->hosts[i];
		char suri[1024];
		int earlier = 0; /* one registration per set, by its first member still up */
		for (int j = 0; j < i; j++) {
			earlier |= !host_failed[j] && (s->hosts[j].roles & (1u << R_SHARD)) &&
				   strcmp(s->hosts[j].shard_name, h->shard_name) == 0;
		}
		if (!(h->roles & (1u << R_SHARD)) || host_failed[i] || earlier) {
			continue;
		}
		shard_uri(s, h, suri, sizeof suri);
		if (add_shard(s, h->shard_name, suri, h) != 0) {
			return 1;
		}
	}
	for (int i = 0; i < s->n_ext; i++) {
		if (add_shard(s, s->ext[i].name, s->ext[i].uri, NULL) != 0) {
			return 1;
		}
	}
	for (int r = R_RATELIMIT; r < R__COUNT; r++) {
		if (bring_up(s, r) != 0) {
			return 1;
		}
	}
	for (int i = 0; i < s->n_hosts; i++) {
		n_failed += host_failed[i];
	}
	if (n_failed > 0) {
		printf("cluster incomplete: %d host%s failed (see above); the others are up\n", n_failed,
		       n_failed == 1 ? "" : "s");
		return 1;
	}
	{
		sbuf m = {0}, p = {0};
		metadata_list(s, &m);
		for (int i = 0; i < s->n_hosts; i++) {
			const cl_host *h = &s->hosts[i];
			if (h->roles & (1u << R_PROXY)) {
				sb_printf(&p, "%s%s:%d", p.len ? "," : "", h->addr, port_of(s, h, P_PROXY_WIRE));
			}
		}
		printf("cluster complete: applications mongodb://%s/  ctl --metadata=%s\n",
		       p.p != NULL ? p.p : "", m.p);
		free(m.p);
		free(p.p);
	}
	return 0;
}

/* status: every shard of the spec registered with the spec's URI (listShards); one stderr
 * line per shard that is not. Returns the number of such shards (1 when listShards fails). */
static int check_registrations(const cl_spec *s)
{
	mongoc_client_t *cl = meta_client(s);
	int bad = 0;

	if (cl == NULL) {
		fprintf(stderr, "stripedb ctl cluster status: bad metadata addresses\n");
		return 1;
	}
	for (int i = 0; i < s->n_hosts + s->n_ext; i++) {
		const cl_host *h = i < s->n_hosts ? &s->hosts[i] : NULL;
		char want[512], reg[512], msg[1400], who[256];
		int f;
		if (h != NULL && (!(h->roles & (1u << R_SHARD)) || shard_seen(s, h))) {
			continue;
		}
		if (h != NULL) {
			shard_uri(s, h, want, sizeof want);
			snprintf(who, sizeof who, "host %s (%s)", h->name, h->addr);
		} else {
			snprintf(want, sizeof want, "%s", s->ext[i - s->n_hosts].uri);
			snprintf(who, sizeof who, "external shard");
		}
		f = registered_uri(cl, h != NULL ? h->shard_name : s->ext[i - s->n_hosts].name, reg,
				   sizeof reg, msg, sizeof msg);
		if (f < 0) {
			fprintf(stderr, "stripedb ctl cluster status: %s\n", msg);
			bad = 1;
			break;
		}
		if (f == 0) {
			fprintf(stderr, "stripedb ctl cluster status: %s: shard %s is not registered (run "
					"bootstrap)\n", who,
				h != NULL ? h->shard_name : s->ext[i - s->n_hosts].name);
			bad++;
		} else if (strcmp(reg, want) != 0) {
			mismatch_msg(msg, sizeof msg, h != NULL ? h->shard_name : s->ext[i - s->n_hosts].name,
				     reg, want);
			fprintf(stderr, "stripedb ctl cluster status: %s: %s\n", who, msg);
			bad++;
		}
	}
	mongoc_client_destroy(cl);
	return bad;
}

static int cluster_status(const cl_spec *s, int json)
{
	const cl_host *leader = find_leader(s);
	int bad = 0;

	for (int i = 0; i < s->n_hosts; i++) {
		const cl_host *h = &s->hosts[i];
		for (int r = 0; r < R__COUNT; r++) {
			int ok;
			if (!(h->roles & (1u << r))) {
				continue;
			}
			ok = role_healthy(s, h, r);
			bad += !ok;
			if (json) {
				printf("{\"host\": \"%s\", \"address\": \"%s\", \"role\": \"%s\", \"healthy\": %s, "
				       "\"leader\": %s}\n",
				       h->name, h->addr, role_name[r], ok ? "true" : "false",
				       r == R_METADATA && h == leader ? "true" : "false");
			} else {
				printf("%-12s %-16s %-12s %s%s\n", h->name, h->addr, role_name[r],
				       ok ? "healthy" : "DOWN",
				       r == R_METADATA && h == leader ? " (leader)" : "");
			}
		}
	}
	if (leader == NULL) {
		fprintf(stderr, "stripedb ctl cluster status: no metadata leader\n");
		bad++;
	} else {
		bad += check_registrations(s);
	}
	return bad == 0 ? 0 : 1;
}

/* --- the agent: runs on a host, invoked over ssh --- */

static int self_exe(char *buf, size_t n)
{
	ssize_t len = readlink("/proc/self/exe", buf, n - 1);

	if (len <= 0) {
		return -1;
	}
	buf[len] = '\0';
	return 0;
}

static void strip_deleted(char *path)
{
	static const char suffix[] = " (deleted)";
	size_t n = strlen(path), k = sizeof suffix - 1;

	if (n > k && strcmp(path + n - k, suffix) == 0) {
		path[n - k] = '\0';
	}
}

static int mkdirs(const char *dir, mode_t mode)
{
	char tmp[PATH_MAX];

	snprintf(tmp, sizeof tmp, "%s", dir);
	for (char *p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			if (mkdir(tmp, mode) != 0 && errno != EEXIST) {
				return -1;
			}
			*p = '/';
		}
	}
	return mkdir(tmp, mode) != 0 && errno != EEXIST ? -1 : 0;
}

/* Write data (len bytes) to path with mode (and owner pw when not NULL), atomically,
 * unless path already holds exactly that. Prints "PATH written|unchanged". */
static int put_one(const char *path, mode_t mode, const struct passwd *pw, const char *data,
		   size_t len)
{
	char *old = NULL, *tmp = NULL, *dir = NULL;
	size_t oldlen = 0;
	int fd = -1, rc = 1;
	struct stat st;

	if (stat(path, &st) == 0 && (st.st_mode & 0777) == mode && (size_t)st.st_size == len &&
	    (pw == NULL || st.st_uid == pw->pw_uid)) {
		FILE *f = fopen(path, "r");
		old = sdb_malloc(len + 1);
		if (f != NULL) {
			oldlen = fread(old, 1, len + 1, f);
			fclose(f);
		}
		if (oldlen == len && memcmp(old, data, len) == 0) {
			printf("%s unchanged\n", path);
			rc = 0;
			goto done;
		}
	}
	dir = sdb_strdup(path);
	*strrchr(dir, '/') = '\0';
	if (dir[0] != '\0' && mkdirs(dir, 0755) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent put: mkdir %s: %s\n", dir, strerror(errno));
		goto done;
	}
	tmp = sdb_asprintf("%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || fchmod(fd, mode) != 0 || (pw != NULL && fchown(fd, pw->pw_uid, pw->pw_gid) != 0) ||
	    write(fd, data, len) != (ssize_t)len || fsync(fd) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent put: %s: %s\n", tmp, strerror(errno));
		unlink(tmp);
		goto done;
	}
	if (close(fd) != 0 || rename(tmp, path) != 0) {
		fd = -1;
		fprintf(stderr, "stripedb ctl cluster agent put: %s: %s\n", path, strerror(errno));
		unlink(tmp);
		goto done;
	}
	fd = -1;
	printf("%s written\n", path);
	rc = 0;
done:
	if (fd >= 0) {
		close(fd);
	}
	if (old != NULL) {
		memset(old, 0, len + 1);
	}
	free(old);
	free(tmp);
	free(dir);
	return rc;
}

/* agent put PATH MODE OWNER|- SIZE [PATH MODE OWNER|- SIZE]...: stdin (at most 1 MiB in
 * all) is the files' contents one after the other, SIZE bytes each; each goes to its PATH
 * (put_one). One ssh round trip writes a host's config file and its cluster key. */
static int agent_put(int argc, char **argv)
{
	char *data = NULL;
	size_t len = 0, want = 0, off = 0;
	int rc = 2;

	if (argc == 0 || argc % 4 != 0) {
		fprintf(stderr, "stripedb ctl cluster agent put: usage: put PATH MODE OWNER|- SIZE ...\n");
		return 2;
	}
	for (int i = 0; i < argc; i += 4) {
		char *end;
		long mode = strtol(argv[i + 1], &end, 8);
		long long size;
		if (!valid_path(argv[i]) || *end != '\0' || mode < 0 || mode > 0777) {
			fprintf(stderr, "stripedb ctl cluster agent put: bad path or mode '%s' '%s'\n",
				argv[i], argv[i + 1]);
			return 2;
		}
		size = strtoll(argv[i + 3], &end, 10);
		if (*end != '\0' || size < 0 || size > CL_MAX_PUT || want + (size_t)size > CL_MAX_PUT) {
			fprintf(stderr, "stripedb ctl cluster agent put: bad size '%s' (at most %d bytes "
					"in all)\n", argv[i + 3], CL_MAX_PUT);
			return 2;
		}
		want += (size_t)size;
	}
	data = sdb_malloc(CL_MAX_PUT + 1);
	for (;;) {
		ssize_t n = read(0, data + len, CL_MAX_PUT + 1 - len);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n < 0) {
			fprintf(stderr, "stripedb ctl cluster agent put: stdin: %s\n", strerror(errno));
			rc = 1;
			goto done;
		}
		if (n == 0) {
			break;
		}
		len += (size_t)n;
		if (len > CL_MAX_PUT) {
			break;
		}
	}
	if (len != want) {
		fprintf(stderr, "stripedb ctl cluster agent put: got %zu bytes on stdin, want %zu\n", len,
			want);
		goto done;
	}
	rc = 0;
	for (int i = 0; i < argc && rc == 0; i += 4) {
		size_t size = (size_t)strtoll(argv[i + 3], NULL, 10);
		const struct passwd *pw = NULL;
		if (strcmp(argv[i + 2], "-") != 0 && (pw = getpwnam(argv[i + 2])) == NULL) {
			fprintf(stderr, "stripedb ctl cluster agent put: no user '%s'\n", argv[i + 2]);
			rc = 1;
			break;
		}
		rc = put_one(argv[i], (mode_t)strtol(argv[i + 1], NULL, 8), pw, data + off, size);
		off += size;
	}
done:
	if (data != NULL) {
		memset(data, 0, len < CL_MAX_PUT + 1 ? len : CL_MAX_PUT + 1);
	}
	free(data);
	return rc;
}

/* 1 when the NUL-separated argument vector of /proc/PID/cmdline holds both role_arg
 * ("--role=ROLE") and conf_arg ("--config=CONFIG"), as agent start execs them; else 0. */
static int cmdline_is(long pid, const char *role_arg, const char *conf_arg)
{
	char path[64], buf[4096];
	size_t n;
	int has_role = 0, has_conf = 0;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
	f = fopen(path, "r");
	if (f == NULL) {
		return 0;
	}
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	for (size_t off = 0; off < n; off += strlen(buf + off) + 1) {
		has_role |= strcmp(buf + off, role_arg) == 0;
		has_conf |= strcmp(buf + off, conf_arg) == 0;
	}
	return has_role && has_conf;
}

/* The pid in file, when it is a live process of this binary started as role_arg with
 * conf_arg (a reused pid, even of another stripedb role, is not); else 0. */
static int live_pid(const char *file, const char *role_arg, const char *conf_arg)
{
	char buf[32] = "", path[64], exe[PATH_MAX], self[PATH_MAX];
	FILE *f = fopen(file, "r");
	long pid;
	ssize_t n;

	if (f == NULL) {
		return 0;
	}
	if (fgets(buf, sizeof buf, f) == NULL) {
		buf[0] = '\0';
	}
	fclose(f);
	pid = strtol(buf, NULL, 10);
	if (pid <= 0 || pid > INT_MAX) {
		return 0;
	}
	snprintf(path, sizeof path, "/proc/%ld/exe", pid);
	n = readlink(path, exe, sizeof exe - 1);
	if (n <= 0 || self_exe(self, sizeof self) != 0) {
		return 0;
	}
	exe[n] = '\0';
	strip_deleted(exe);
	strip_deleted(self);
	{
		/* a zombie (exited, not reaped) is not alive */
		char stat_path[64], st[256] = "";
		FILE *sf;
		snprintf(stat_path, sizeof stat_path, "/proc/%ld/stat", pid);
		sf = fopen(stat_path, "r");
		if (sf != NULL) {
			if (fgets(st, sizeof st, sf) == NULL) {
				st[0] = '\0';
			}
			fclose(sf);
		}
		char *rp = strrchr(st, ')');
		if (rp != NULL && rp[1] == ' ' && rp[2] == 'Z') {
			return 0;
		}
	}
	return strcmp(exe, self) == 0 && cmdline_is(pid, role_arg, conf_arg) ? (int)pid : 0;
}

/* agent start ROLE CONFIG DATADIR: start `stripedb --role=ROLE --config=CONFIG` detached
 * unless DATADIR/run/ROLE.pid names a live stripedb whose command line is this role and
 * this config (else the pid file is stale, e.g. a reused pid, and is replaced). Prints
 * "started (pid N)" or "running (pid N)". */
static int agent_start_locked(int argc, char **argv)
{
	char exe[PATH_MAX], pidfile[PATH_MAX + 32], tmp[PATH_MAX + 48], log[PATH_MAX + 32];
	char run[PATH_MAX + 8], logs[PATH_MAX + 8], role_arg[64], conf_arg[PATH_MAX + 16];
	int fd, pid;
	pid_t child;
	FILE *f;

	if (argc != 3 || role_index(argv[0]) < 0 || !valid_path(argv[1]) || !valid_path(argv[2])) {
		fprintf(stderr, "stripedb ctl cluster agent start: usage: start ROLE CONFIG DATADIR\n");
		return 2;
	}
	snprintf(run, sizeof run, "%s/run", argv[2]);
	snprintf(logs, sizeof logs, "%s/logs", argv[2]);
	snprintf(pidfile, sizeof pidfile, "%s/%s.pid", run, argv[0]);
	if (mkdirs(run, 0755) != 0 || mkdirs(logs, 0755) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: mkdir %s: %s\n", argv[2],
			strerror(errno));
		return 1;
	}
	snprintf(role_arg, sizeof role_arg, "--role=%s", argv[0]);
	snprintf(conf_arg, sizeof conf_arg, "--config=%s", argv[1]);
	pid = live_pid(pidfile, role_arg, conf_arg);
	if (pid > 0) {
		printf("running (pid %d)\n", pid);
		return 0;
	}
	if (self_exe(exe, sizeof exe) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: /proc/self/exe: %s\n", strerror(errno));
		return 1;
	}
	strip_deleted(exe);
	snprintf(log, sizeof log, "%s/%s.log", logs, argv[0]);
	fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	if (fd < 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: %s: %s\n", log, strerror(errno));
		return 1;
	}
	fflush(stdout);
	child = fork();
	if (child < 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: fork: %s\n", strerror(errno));
		close(fd);
		return 1;
	}
	if (child == 0) {
		char *cargv[] = {exe, role_arg, conf_arg, NULL};
		int null = open("/dev/null", O_RDONLY);
		setsid();
		dup2(null, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		for (int k = 3; k < 1024; k++) {
			close(k);
		}
		unsetenv("STRIPEDB_CONFIG");
		execv(exe, cargv);
		fprintf(stderr, "stripedb ctl cluster agent start: exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(fd);
	snprintf(tmp, sizeof tmp, "%s.tmp", pidfile);
	f = fopen(tmp, "w");
	if (f != NULL && fprintf(f, "%d\n", (int)child) < 0) {
		fclose(f);
		f = NULL;
	}
	if (f == NULL || fclose(f) != 0 || rename(tmp, pidfile) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: %s: %s\n", pidfile, strerror(errno));
		return 1;
	}
	printf("started (pid %d)\n", (int)child);
	return 0;
}

/* Two bootstraps at once (one interrupted, its ssh still running, and the next) must not
 * start a role twice: the check of the pid file and the start happen under an exclusive
 * flock(2) of DATADIR/run/ROLE.lock (released when the agent exits). */
static int agent_start(int argc, char **argv)
{
	char run[PATH_MAX + 8], lock[PATH_MAX + 48];
	int fd, rc;

	if (argc != 3 || role_index(argv[0]) < 0 || !valid_path(argv[2])) {
		return agent_start_locked(argc, argv); /* its usage error */
	}
	snprintf(run, sizeof run, "%s/run", argv[2]);
	snprintf(lock, sizeof lock, "%s/%s.lock", run, argv[0]);
	if (mkdirs(run, 0755) != 0 || (fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: %s: %s\n", lock, strerror(errno));
		return 1;
	}
	while (flock(fd, LOCK_EX) != 0) {
		if (errno != EINTR) {
			fprintf(stderr, "stripedb ctl cluster agent start: flock %s: %s\n", lock,
				strerror(errno));
			close(fd);
			return 1;
		}
	}
	rc = agent_start_locked(argc, argv);
	close(fd);
	return rc;
}

/* --- entry --- */

static void log_drop(mongoc_log_level_t level, const char *domain, const char *message, void *data)
{
	(void)level;
	(void)domain;
	(void)message;
	(void)data;
}

static const char cluster_usage[] =
	"usage: stripedb ctl cluster bootstrap --spec FILE [--verbose]\n"
	"       stripedb ctl cluster status --spec FILE [--json]\n"
	"       stripedb ctl cluster config --spec FILE HOST\n"
	"bootstrap builds (or finishes) the cluster the spec describes over SSH, status checks\n"
	"every role of it, config prints the config file bootstrap writes on HOST.\n"
	"See stripedb-ctl(1) and packaging/cluster.conf.example.\n";

static int is_help(const char *a)
{
	return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 || strcmp(a, "help") == 0;
}

static int usage(const char *msg)
{
	fprintf(stderr, "stripedb ctl cluster: %s (usage: cluster bootstrap --spec FILE [--verbose] | "
			"status --spec FILE [--json] | config --spec FILE HOST)\n", msg);
	return 2;
}

int cli_cluster_main(int argc, char **argv)
{
	const char *spec_path = NULL, *host = NULL;
	int json = 0, rc;
	static cl_spec spec;

	if (argc == 0) {
		return usage("missing subcommand");
	}
	if (strcmp(argv[0], "agent") == 0) {
		if (argc >= 2 && strcmp(argv[1], "put") == 0) {
			return agent_put(argc - 2, argv + 2);
		}
		if (argc >= 2 && strcmp(argv[1], "start") == 0) {
			return agent_start(argc - 2, argv + 2);
		}
		return usage("agent put|start");
	}
	/* --help (any word after the subcommand but a HOST named help): the usage on stdout, exit 0 */
	for (int i = 0; i < argc; i++) {
		if (is_help(argv[i]) && (i == 0 || strcmp(argv[i], "help") != 0)) {
			fputs(cluster_usage, stdout);
			return 0;
		}
	}
	if (strcmp(argv[0], "bootstrap") != 0 && strcmp(argv[0], "status") != 0 &&
	    strcmp(argv[0], "config") != 0) {
		return usage("unknown subcommand");
	}
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--spec") == 0 && i + 1 < argc) {
			spec_path = argv[++i];
		} else if (strncmp(argv[i], "--spec=", 7) == 0) {
			spec_path = argv[i] + 7;
		} else if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else if (strcmp(argv[i], "--verbose") == 0) {
			verbose = 1;
		} else if (strcmp(argv[0], "config") == 0 && argv[i][0] != '-' && host == NULL) {
			host = argv[i];
		} else {
			char msg[128];
			snprintf(msg, sizeof msg, "unexpected argument '%.80s'", argv[i]);
			return usage(msg);
		}
	}
	if (spec_path == NULL) {
		return usage("--spec FILE is required");
	}
	if (strcmp(argv[0], "config") == 0 && host == NULL) {
		return usage("config needs a HOST (a section of the spec)");
	}
	/* one stderr line per failure: no info lines (e.g. "cluster key loaded"), no libmongoc
	 * lines (its errors reach us through bson_error_t) */
	sdb_log_set_level(verbose ? SDB_LOG_INFO : SDB_LOG_WARN);
	mongoc_log_set_handler(log_drop, NULL);
	if (load_spec(spec_path, &spec) != 0) {
		return 2;
	}
	if (host != NULL) {
		for (int i = 0; i < spec.n_hosts; i++) {
			if (strcmp(spec.hosts[i].name, host) == 0) {
				char *conf = host_config(&spec, &spec.hosts[i]);
				fputs(conf, stdout);
				free(conf);
				free_spec(&spec);
				return 0;
			}
		}
		fprintf(stderr, "stripedb ctl cluster config: no host [%s] in %s\n", host, spec_path);
		free_spec(&spec);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	mongoc_init();
	rc = strcmp(argv[0], "bootstrap") == 0 ? cluster_bootstrap(&spec) : cluster_status(&spec, json);
	mongoc_cleanup();
	curl_global_cleanup();
	free_spec(&spec);
	return rc;
}
