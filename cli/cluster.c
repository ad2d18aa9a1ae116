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
#include "common/metauri.h"
#include "common/clock.h"
#include "common/log.h"

int cli_cluster_main(int argc, char **argv);

/* The HTTP port key of each role. */
static const int role_http[R__COUNT] = {P_HTTP_META, P_HTTP_SHARD, P_HTTP_RL, P_HTTP_PROXY,
					P_HTTP_COORD};


/* bootstrap: hosts whose config could not be written or whose role could not be started
 * over SSH (one stderr line each, at the time): the later steps skip them and the run
 * exits 1 at the end, after repairing every other host. Indexed like cl_spec.hosts. */
static int host_failed[CL_MAX_HOSTS];

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
	return http_status(h->addr, cl_port_of(s, h, role_http[r]), "/healthz") == 200;
}

/* hello on one metadata member: 1 leader, 0 not (or unreachable). */
static int member_leads(const cl_spec *s, const cl_host *h)
{
	char hp[256];
	char *uri;
	mongoc_client_t *cl;
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it;
	int leader = 0;

	snprintf(hp, sizeof hp, "%s:%d", h->addr, cl_port_of(s, h, P_META_WIRE));
	uri = sdb_meta_uri(hp, true, 2000, 2000, 0);
	cl = auth_cluster_client_new(uri);
	free(uri);
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
	cl_sb_printf(b, " '%s'", tok);
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
		char *conf = cl_host_config(s, h);
		sbuf cmd = {0}, in = {0};
		cl_host_config_path(s, h, path, sizeof path);
		quote(&cmd, s->binary);
		cl_sb_printf(&cmd, " ctl cluster agent put");
		quote(&cmd, path);
		cl_sb_printf(&cmd, " 0644 - %zu", strlen(conf));
		cl_sb_printf(&in, "%s", conf);
		free(conf);
		if (keylen > 0) {
			cl_host_key_path(s, h, key, sizeof key);
			quote(&cmd, key);
			cl_sb_printf(&cmd, " 0600 %s %zu", s->launcher_systemd ? "stripedb" : "-", keylen);
			cl_sb_printf(&in, "%.*s", (int)keylen, keybuf);
		}
		cl_ssh_start(s, h, cmd.p + 1, in.p, in.len, &jobs[i]);
		memset(in.p, 0, in.len);
		free(in.p);
		free(cmd.p);
	}
	memset(keybuf, 0, sizeof keybuf);
	deadline = sdb_mono_ms() + CL_SSH_TIMEOUT_MS;
	for (int i = 0; i < s->n_hosts; i++) {
		char out[512];
		if (cl_ssh_finish(&jobs[i], deadline, out, sizeof out) != 0) {
			/* this host is skipped from here on; the others go on */
			fail(&s->hosts[i], "writing the config", out[0] ? out : "ssh failed");
			host_failed[i] = 1;
		} else if (cl_verbose) {
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
	snprintf(what, sizeof what, "role %s", cl_role_name[r]);
	if (s->launcher_systemd) {
		snprintf(msg, sizeof msg, "no healthy /healthz on port %d after %d s (journalctl -u "
					  "stripedb@%s)", cl_port_of(s, h, role_http[r]), s->timeout_ms / 1000,
			 cl_role_name[r]);
	} else {
		snprintf(msg, sizeof msg, "no healthy /healthz on port %d after %d s (see %s/logs/%s.log)",
			 cl_port_of(s, h, role_http[r]), s->timeout_ms / 1000, h->data_dir, cl_role_name[r]);
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
			printf("%-12s %-12s skipped (the host failed)\n", h->name, cl_role_name[r]);
			continue;
		}
		if (role_healthy(s, h, r)) {
			printf("%-12s %-12s already healthy\n", h->name, cl_role_name[r]);
			continue;
		}
		if (s->launcher_systemd) {
			cl_sb_printf(&cmd, " systemctl enable --now 'stripedb@%s'", cl_role_name[r]);
		} else {
			char conf[PATH_MAX];
			cl_host_config_path(s, h, conf, sizeof conf);
			quote(&cmd, s->binary);
			cl_sb_printf(&cmd, " ctl cluster agent start %s", cl_role_name[r]);
			quote(&cmd, conf);
			quote(&cmd, h->data_dir);
		}
		cl_ssh_start(s, h, cmd.p + 1, NULL, 0, &jobs[i]);
		started[i] = 1;
		free(cmd.p);
	}
	deadline = sdb_mono_ms() + CL_SSH_TIMEOUT_MS;
	for (int i = 0; i < s->n_hosts; i++) {
		char out[512], what[64];
		if (!started[i]) {
			continue;
		}
		snprintf(what, sizeof what, "role %s", cl_role_name[r]);
		if (cl_ssh_finish(&jobs[i], deadline, out, sizeof out) != 0) {
			/* skipped from here on; the other hosts go on */
			fail(&s->hosts[i], what, out[0] ? out : "ssh failed");
			host_failed[i] = 1;
		} else {
			printf("%-12s %-12s %s\n", s->hosts[i].name, cl_role_name[r], out[0] ? out : "started");
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
	cli_rs_uri u;
	cli_rs_uri_begin(&u, buf, n);
	for (int i = 0; i < s->n_hosts; i++) {
		const cl_host *m = &s->hosts[i];
		if ((m->roles & (1u << R_SHARD)) && strcmp(m->shard_name, h->shard_name) == 0)
			cli_rs_uri_add(&u, m->addr, cl_port_of(s, m, P_SHARD_WIRE));
	}
	cli_rs_uri_end(&u, h->shard_name);
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
	sbuf hosts = {0};
	mongoc_client_t *cl;
	char *uri;

	cl_metadata_list(s, &hosts);
	uri = sdb_meta_uri(hosts.p ? hosts.p : "", false, 5000, 0, 0);
	cl = auth_cluster_client_new(uri);
	free(uri);
	free(hosts.p);
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
		cl_metadata_list(s, &m);
		for (int i = 0; i < s->n_hosts; i++) {
			const cl_host *h = &s->hosts[i];
			if (h->roles & (1u << R_PROXY)) {
				cl_sb_printf(&p, "%s%s:%d", p.len ? "," : "", h->addr, cl_port_of(s, h, P_PROXY_WIRE));
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
				       h->name, h->addr, cl_role_name[r], ok ? "true" : "false",
				       r == R_METADATA && h == leader ? "true" : "false");
			} else {
				printf("%-12s %-16s %-12s %s%s\n", h->name, h->addr, cl_role_name[r],
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
			return cl_agent_put(argc - 2, argv + 2);
		}
		if (argc >= 2 && strcmp(argv[1], "start") == 0) {
			return cl_agent_start(argc - 2, argv + 2);
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
			cl_verbose = 1;
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
	sdb_log_set_level(cl_verbose ? SDB_LOG_INFO : SDB_LOG_WARN);
	mongoc_log_set_handler(log_drop, NULL);
	if (cl_load_spec(spec_path, &spec) != 0) {
		return 2;
	}
	if (host != NULL) {
		for (int i = 0; i < spec.n_hosts; i++) {
			if (strcmp(spec.hosts[i].name, host) == 0) {
				char *conf = cl_host_config(&spec, &spec.hosts[i]);
				fputs(conf, stdout);
				free(conf);
				cl_free_spec(&spec);
				return 0;
			}
		}
		fprintf(stderr, "stripedb ctl cluster config: no host [%s] in %s\n", host, spec_path);
		cl_free_spec(&spec);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	mongoc_init();
	rc = strcmp(argv[0], "bootstrap") == 0 ? cluster_bootstrap(&spec) : cluster_status(&spec, json);
	mongoc_cleanup();
	curl_global_cleanup();
	cl_free_spec(&spec);
	return rc;
}
