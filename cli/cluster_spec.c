/* `stripedb ctl cluster`: the spec file (INI, read with inih; packaging/cluster.conf.example),
 * its validation (every string that reaches a remote shell passes a strict alphabet) and
 * the per-host config file bootstrap writes (see cli/cluster.c for the command). */
#include "cli/cli.h"
#include "cli/cluster_int.h"

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


/* Start order (dependency order); names are the --role values. */
const char *const cl_role_name[R__COUNT] = {"metadata", "shard", "ratelimit", "proxy",
						"coordinator"};

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

int cl_valid_path(const char *s)
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

int cl_role_index(const char *r)
{
	for (int i = 0; i < R__COUNT; i++) {
		if (strcmp(cl_role_name[i], r) == 0) {
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
		if (!cl_valid_path(v)) {
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
			int r = cl_role_index(t);
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
		if (!cl_valid_path(v)) {
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

int cl_port_of(const cl_spec *s, const cl_host *h, int p)
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
			if (cl_port_of(s, h, pa) != cl_port_of(s, h, pb)) {
				continue;
			}
			la = port_line(s, h, pa);
			lb = port_line(s, h, pb);
			snprintf(err, errlen, "%s:%d: host %s: port %d used twice (%s, %s)", s->path,
				 la > lb ? la : lb, h->name, cl_port_of(s, h, pa), port_def[pa].key,
				 port_def[pb].key);
			return -1;
		}
	}
	return 0;
}

void cl_free_spec(cl_spec *s)
{
	for (int i = 0; i < s->n_ssh_opts; i++) {
		free(s->ssh_opts[i]);
	}
	s->n_ssh_opts = 0;
}

/* Load and check path into *s; 0 or -1 with a message on stderr. */
int cl_load_spec(const char *path, cl_spec *s)
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
	cl_free_spec(s);
	return -1;
}

/* Remote config path and key path of a host. */
void cl_host_config_path(const cl_spec *s, const cl_host *h, char *buf, size_t n)
{
	if (s->config[0] != '\0') {
		snprintf(buf, n, "%s", s->config);
	} else {
		snprintf(buf, n, "%s/stripedb.conf", h->data_dir);
	}
}

void cl_host_key_path(const cl_spec *s, const cl_host *h, char *buf, size_t n)
{
	if (s->remote_key[0] != '\0') {
		snprintf(buf, n, "%s", s->remote_key);
	} else {
		snprintf(buf, n, "%s/cluster.key", h->data_dir);
	}
}

/* --- a growable text buffer --- */

void cl_sb_printf(sbuf *b, const char *fmt, ...)
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
void cl_metadata_list(const cl_spec *s, sbuf *b)
{
	int first = 1;

	for (int i = 0; i < s->n_hosts; i++) {
		const cl_host *h = &s->hosts[i];
		if (h->roles & (1u << R_METADATA)) {
			cl_sb_printf(b, "%s%s:%d", first ? "" : ",", h->addr, cl_port_of(s, h, P_META_WIRE));
			first = 0;
		}
	}
}

/* The config file of one host: global keys, then a section per role it runs. */
char *cl_host_config(const cl_spec *s, const cl_host *h)
{
	sbuf b = {0};
	char key[PATH_MAX];

	cl_sb_printf(&b, "# %s: written by `stripedb ctl cluster bootstrap --spec %s` for host [%s].\n"
		      "# Re-running the bootstrap rewrites it; edit the spec instead.\n",
		  s->config[0] ? s->config : "stripedb.conf", s->path, h->name);
	cl_sb_printf(&b, "log-level = %s\nmetadata = ", s->log_level);
	cl_metadata_list(s, &b);
	cl_sb_printf(&b, "\n");
	if (s->key_file[0] != '\0') {
		cl_host_key_path(s, h, key, sizeof key);
		cl_sb_printf(&b, "cluster-key-file = %s\n", key);
	}
	if (h->roles & (1u << R_METADATA)) {
		cl_sb_printf(&b, "\n[metadata]\nnode-id = %d\ndata-dir = %s/metadata\nlisten = %s:%d\n"
			      "raft-listen = %s:%d\nhttp-listen = %s:%d\nbootstrap-members = ",
			  h->meta_id, h->data_dir, h->addr, cl_port_of(s, h, P_META_WIRE), h->addr,
			  cl_port_of(s, h, P_META_RAFT), h->addr, cl_port_of(s, h, P_HTTP_META));
		for (int i = 0, first = 1; i < s->n_hosts; i++) {
			const cl_host *m = &s->hosts[i];
			if (m->roles & (1u << R_METADATA)) {
				cl_sb_printf(&b, "%s%d@%s:%d", first ? "" : ",", m->meta_id, m->addr,
					  cl_port_of(s, m, P_META_RAFT));
				first = 0;
			}
		}
		cl_sb_printf(&b, "\n");
	}
	if (h->roles & (1u << R_SHARD)) {
		/* a member of the replica set of every host with this shard-name (issue #15) */
		cl_sb_printf(&b, "\n[shard]\nreplica-set = %s\nnode-id = %d\ndata-dir = %s/shard\n"
			      "listen = %s:%d\nraft-listen = %s:%d\nhttp-listen = %s:%d\n"
			      "bootstrap-members = ",
			  h->shard_name, h->shard_id, h->data_dir, h->addr, cl_port_of(s, h, P_SHARD_WIRE),
			  h->addr, cl_port_of(s, h, P_SHARD_RAFT), h->addr, cl_port_of(s, h, P_HTTP_SHARD));
		for (int i = 0, first = 1; i < s->n_hosts; i++) {
			const cl_host *m = &s->hosts[i];
			if ((m->roles & (1u << R_SHARD)) && strcmp(m->shard_name, h->shard_name) == 0) {
				cl_sb_printf(&b, "%s%d@%s:%d", first ? "" : ",", m->shard_id, m->addr,
					  cl_port_of(s, m, P_SHARD_RAFT));
				first = 0;
			}
		}
		cl_sb_printf(&b, "\n");
	}
	/* The rate-limit peer ring: every rate limiter and every proxy with a gRPC address
	 * registers with the metadata service (the global `metadata =` above) and builds its
	 * ring from the registry (issue #23, src/ratelimit/README.md "Membership"), so a
	 * host added or removed later changes every ring without a config change. */
	if (h->roles & (1u << R_RATELIMIT)) {
		cl_sb_printf(&b, "\n[ratelimit]\nnode-id = ratelimit-%s\nhttp-listen = %s:%d\n"
			      "grpc-listen = %s:%d\n",
			  h->name, h->addr, cl_port_of(s, h, P_HTTP_RL), h->addr,
			  cl_port_of(s, h, P_RL_GRPC));
	}
	if (h->roles & (1u << R_PROXY)) {
		cl_sb_printf(&b, "\n[proxy]\nnode-id = proxy-%s\nlisten = %s:%d\nhttp-listen = %s:%d\n"
			      "grpc-listen = %s:%d\n",
			  h->name, h->addr, cl_port_of(s, h, P_PROXY_WIRE), h->addr,
			  cl_port_of(s, h, P_HTTP_PROXY), h->addr, cl_port_of(s, h, P_PROXY_GRPC));
		if (s->auth[0] != '\0')
			cl_sb_printf(&b, "auth = %s\n", s->auth);
	}
	if (h->roles & (1u << R_COORDINATOR)) {
		cl_sb_printf(&b, "\n[coordinator]\nnode-id = coordinator-%s\nhttp-listen = %s:%d\n"
			      "cdc = embedded:%s/cdc\narchive = file:%s/archive\n",
			  h->name, h->addr, cl_port_of(s, h, P_HTTP_COORD), h->data_dir, h->data_dir);
	}
	return b.p;
}

