/* `stripedb ctl shard list` and `stripedb ctl shard member ...`: shard replica sets
 * (issue #15; contract in cli/shardset.h, commands in src/shard/README.md).
 *
 *   stripedb ctl shard list                                  every shard's members
 *   stripedb ctl shard member status SHARD                   one shard's members
 *   stripedb ctl shard member add SHARD ID --raft=H:P --wire=H:P
 *   stripedb ctl shard member remove SHARD ID
 *   stripedb ctl shard member transfer SHARD [ID]
 *
 * SHARD is a shard id registered with metadata (its URI comes from listShards), or the
 * shard's address itself (mongodb://... URI or H:P,H:P; then no --metadata is needed). add/remove/transfer run on the
 * primary (found through hello); the member to add is started first with the set's
 * --replica-set and a --bootstrap-members list without its own --node-id.
 */
#include "cli/shardset.h"

#include <inttypes.h>
#include <stdbool.h>
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "common/alloc.h"

static mongoc_client_t *direct_client(const char *host, int timeout_ms)
{
	char *u = sdb_asprintf("mongodb://%s/?directConnection=true&serverSelectionTimeoutMS=%d&"
			       "connectTimeoutMS=%d&socketTimeoutMS=%d",
			       host, timeout_ms, timeout_ms, timeout_ms * 3);
	mongoc_client_t *c = auth_cluster_client_new(u);
	free(u);
	if (c)
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	return c;
}

static int add_host(char hosts[][256], int n, int max, const char *h)
{
	for (int i = 0; i < n; i++)
		if (strcmp(hosts[i], h) == 0)
			return n;
	if (n < max)
		snprintf(hosts[n++], 256, "%.255s", h);
	return n;
}

/* The seed hosts of addr. */
static int seed_hosts(const char *addr, char hosts[][256], int max)
{
	char *u = strncmp(addr, "mongodb://", 10) == 0 ? sdb_strdup(addr)
						       : sdb_asprintf("mongodb://%s/", addr);
	mongoc_uri_t *uri = mongoc_uri_new(u);
	int n = 0;
	free(u);
	if (!uri)
		return 0;
	for (const mongoc_host_list_t *h = mongoc_uri_get_hosts(uri); h; h = h->next)
		n = add_host(hosts, n, max, h->host_and_port);
	mongoc_uri_destroy(uri);
	return n;
}

static int64_t i64(const bson_t *d, const char *k)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it)
									      : 0;
}

static void str(const bson_t *d, const char *k, char *buf, size_t n)
{
	bson_iter_t it;
	buf[0] = '\0';
	if (bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_UTF8(&it))
		snprintf(buf, n, "%s", bson_iter_utf8(&it, NULL));
}

/* hello on host: add the hosts it lists; set *primary to the primary it names. */
static int hello_hosts(const char *host, int timeout_ms, char hosts[][256], int n, int max,
		       char *primary, size_t plen)
{
	mongoc_client_t *c = direct_client(host, timeout_ms);
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it, ai;
	if (!c)
		return n;
	BSON_APPEND_INT32(&cmd, "hello", 1);
	if (mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
		if (bson_iter_init_find(&it, &reply, "hosts") && BSON_ITER_HOLDS_ARRAY(&it) &&
		    bson_iter_recurse(&it, &ai))
			while (bson_iter_next(&ai))
				if (BSON_ITER_HOLDS_UTF8(&ai))
					n = add_host(hosts, n, max, bson_iter_utf8(&ai, NULL));
		if (primary && !primary[0]) {
			if (bson_iter_init_find(&it, &reply, "isWritablePrimary") &&
			    bson_iter_as_bool(&it))
				snprintf(primary, plen, "%s", host);
			else
				str(&reply, "primary", primary, plen);
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(c);
	return n;
}

/* Every member host of addr; *primary (when not NULL) gets the primary's address or "". */
static int all_hosts(const char *addr, int timeout_ms, char hosts[][256], int max, char *primary,
		     size_t plen)
{
	int n = seed_hosts(addr, hosts, max), seeds = n;
	if (primary)
		primary[0] = '\0';
	for (int i = 0; i < seeds; i++)
		n = hello_hosts(hosts[i], timeout_ms, hosts, n, max, primary, plen);
	return n;
}

/* The primary's memberStatus entry for m (by host, else by id), or false. */
static bool find_progress(const bson_t *status, const shardset_member *m, bson_t *out)
{
	bson_iter_t it, ai;
	if (!bson_iter_init_find(&it, status, "memberStatus") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &ai))
		return false;
	while (bson_iter_next(&ai)) {
		char host[256];
		if (!sdb_bson_iter_doc(&ai, out))
			continue;
		str(out, "host", host, sizeof host);
		if ((host[0] && strcmp(host, m->host) == 0) ||
		    (m->reachable && m->id && i64(out, "id") == m->id))
			return true;
	}
	return false;
}

static bool bool_field(const bson_t *d, const char *k)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, d, k) && bson_iter_as_bool(&it);
}

static void apply_progress(shardset_member *m, const bson_t *e)
{
	m->lag = i64(e, "lagEntries");
	m->lag_ms = i64(e, "lagMillis");
	m->primary_sees = bool_field(e, "reachable") ? 1 : 0;
	if (!m->reachable)
		m->id = i64(e, "id");
}

int shardset_status(const char *addr, int timeout_ms, shardset_member *out, int max)
{
	char hosts[SHARDSET_MAX][256];
	int n = all_hosts(addr, timeout_ms, hosts, SHARDSET_MAX, NULL, 0);
	bson_t *primary = NULL; /* the primary's replSetGetStatus */
	if (n > max)
		n = max;
	for (int i = 0; i < n; i++) {
		shardset_member *m = &out[i];
		mongoc_client_t *c = direct_client(hosts[i], timeout_ms);
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		memset(m, 0, sizeof *m);
		snprintf(m->host, sizeof m->host, "%.255s", hosts[i]);
		m->lag = m->lag_ms = -1;
		m->primary_sees = -1;
		BSON_APPEND_INT32(&cmd, "replSetGetStatus", 1);
		if (c && mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
			m->reachable = 1;
			str(&reply, "setName", m->set, sizeof m->set);
			str(&reply, "state", m->state, sizeof m->state);
			m->id = i64(&reply, "id");
			m->term = i64(&reply, "term");
			m->primary_id = i64(&reply, "primaryId");
			m->applied = i64(&reply, "applied");
			m->commit = i64(&reply, "commitIndex");
			m->is_primary = strcmp(m->state, "PRIMARY") == 0;
			if (m->is_primary && !primary)
				primary = bson_copy(&reply);
		}
		if (c) {
			bson_destroy(&reply);
			mongoc_client_destroy(c);
		}
		bson_destroy(&cmd);
	}
	if (!primary)
		return n;
	/* lag as the primary sees it, for the members that did not answer too */
	for (int i = 0; i < n; i++) {
		bson_t e;
		if (find_progress(primary, &out[i], &e))
			apply_progress(&out[i], &e);
	}
	/* members in the primary's configuration whose address no host listed */
	bson_iter_t it, ai;
	if (bson_iter_init_find(&it, primary, "memberStatus") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &ai)) {
		while (bson_iter_next(&ai) && n < max) {
			bson_t e;
			bool known = false;
			if (!sdb_bson_iter_doc(&ai, &e))
				continue;
			for (int k = 0; k < n; k++)
				known |= out[k].id == i64(&e, "id");
			if (known)
				continue;
			shardset_member *m = &out[n++];
			memset(m, 0, sizeof *m);
			str(&e, "host", m->host, sizeof m->host);
			if (!m->host[0]) {
				char raft[200];
				str(&e, "raft", raft, sizeof raft);
				snprintf(m->host, sizeof m->host, "raft:%s", raft);
			}
			apply_progress(m, &e);
		}
	}
	bson_destroy(primary);
	return n;
}

/* ------------------------------------------------------------------ printing */

static void print_header(void)
{
	printf("%-12s %-22s %-4s %-12s %-6s %-9s %-9s %-7s %-8s %s\n", "SHARD", "MEMBER", "ID",
	       "STATE", "TERM", "APPLIED", "COMMIT", "LAG", "LAG_MS", "PRIMARY");
}

static void fmt_i64(char *buf, size_t n, int64_t v)
{
	if (v >= 0)
		snprintf(buf, n, "%" PRId64, v);
	else
		snprintf(buf, n, "-");
}

/* Append one member's fields to doc (the JSON of ctl shard list / member status / top). */
void shardset_member_bson(const shardset_member *m, bson_t *doc)
{
	BSON_APPEND_UTF8(doc, "host", m->host);
	BSON_APPEND_BOOL(doc, "reachable", m->reachable != 0);
	if (m->id)
		BSON_APPEND_INT64(doc, "id", m->id);
	if (m->reachable) {
		BSON_APPEND_UTF8(doc, "setName", m->set);
		BSON_APPEND_UTF8(doc, "state", m->state);
		BSON_APPEND_INT64(doc, "term", m->term);
		BSON_APPEND_INT64(doc, "applied", m->applied);
		BSON_APPEND_INT64(doc, "commitIndex", m->commit);
		BSON_APPEND_INT64(doc, "primaryId", m->primary_id);
	} else {
		BSON_APPEND_UTF8(doc, "state", "UNREACHABLE");
	}
	BSON_APPEND_INT64(doc, "lag", m->lag);
	BSON_APPEND_INT64(doc, "lagMillis", m->lag_ms);
	if (m->primary_sees >= 0)
		BSON_APPEND_BOOL(doc, "primarySees", m->primary_sees != 0);
	BSON_APPEND_BOOL(doc, "primary", m->is_primary != 0);
}

static void print_members(int json, const char *shard, const char *uri, const shardset_member *m,
			  int n, int *first)
{
	if (json) {
		bson_t doc = BSON_INITIALIZER, arr, one;
		char key[16];
		BSON_APPEND_UTF8(&doc, "id", shard);
		BSON_APPEND_UTF8(&doc, "uri", uri);
		bson_append_array_begin(&doc, "members", -1, &arr);
		for (int i = 0; i < n; i++) {
			snprintf(key, sizeof key, "%d", i);
			bson_append_document_begin(&arr, key, -1, &one);
			shardset_member_bson(&m[i], &one);
			bson_append_document_end(&arr, &one);
		}
		bson_append_array_end(&doc, &arr);
		char *j = bson_as_relaxed_extended_json(&doc, NULL);
		printf("%s%s", *first ? "" : ", ", j);
		bson_free(j);
		bson_destroy(&doc);
		*first = 0;
		return;
	}
	for (int i = 0; i < n; i++) {
		char lag[24], lag_ms[24], id[24];
		fmt_i64(lag, sizeof lag, m[i].lag);
		fmt_i64(lag_ms, sizeof lag_ms, m[i].lag_ms);
		fmt_i64(id, sizeof id, m[i].id ? m[i].id : -1);
		if (!m[i].reachable) {
			printf("%-12s %-22s %-4s %-12s %-6s %-9s %-9s %-7s %-8s\n", shard, m[i].host, id,
			       "UNREACHABLE", "-", "-", "-", lag, lag_ms);
			continue;
		}
		printf("%-12s %-22s %-4s %-12s %-6" PRId64 " %-9" PRId64 " %-9" PRId64
		       " %-7s %-8s %s\n",
		       shard, m[i].host, id, m[i].state, m[i].term, m[i].applied, m[i].commit, lag,
		       lag_ms, m[i].is_primary ? "*" : "");
	}
}

/* ------------------------------------------------------------------ commands */

/* The address of shard (an id registered with metadata, or an address). 0 or exit code. */
/* When addr names a set (replicaSet=NAME), the set its reachable hosts report in hello
 * must be NAME: a URI with one set's name and another set's hosts would otherwise act on
 * the other set. Returns 0 (the same set, no name to check, or no host reachable: the
 * command then fails on its own), or 1 after printing the one error line. */
static int check_set_name(const char *addr, int timeout_ms)
{
	char hosts[SHARDSET_MAX][256];
	mongoc_uri_t *uri = strncmp(addr, "mongodb://", 10) == 0 ? mongoc_uri_new(addr) : NULL;
	const char *want = uri ? mongoc_uri_get_replica_set(uri) : NULL;
	int rc = 0, n = want ? seed_hosts(addr, hosts, SHARDSET_MAX) : 0;
	for (int i = 0; i < n && rc == 0; i++) {
		mongoc_client_t *c = direct_client(hosts[i], timeout_ms);
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		char got[256];
		BSON_APPEND_INT32(&cmd, "hello", 1);
		if (c && mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
			str(&reply, "setName", got, sizeof got);
			if (strcmp(got, want) != 0) {
				fprintf(stderr, "stripedb ctl shard member: %s is a member of replica set "
						"'%s', not '%s' (replicaSet in the URI)\n",
					hosts[i], got[0] ? got : "(none)", want);
				rc = 1;
			}
			i = n; /* one reachable host answers for the set */
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
		if (c)
			mongoc_client_destroy(c);
	}
	if (uri)
		mongoc_uri_destroy(uri);
	return rc;
}

/* The MongoDB URI of shard into out[n]: shard itself when it already is a URI or H:P,
 * else the uri of the listShards entry with that id. Returns: 0, 1 after an error line
 * (listShards failed, no such shard; nothing printed when the reply has no shards
 * array), or 2 (no metadata client). */
static int resolve(cli_ctx *ctx, const char *shard, char *out, size_t n)
{
	if (strncmp(shard, "mongodb://", 10) == 0 || strchr(shard, ':')) {
		snprintf(out, n, "%s", shard);
		return 0;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	bson_t cmd = BSON_INITIALIZER, reply, d;
	bson_error_t e;
	bson_iter_t it;
	int rc = 1;
	if (!c)
		return 2;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
		fprintf(stderr, "stripedb ctl shard: listShards: %s\n", e.message);
	} else if (cli_iter_array(&reply, "shards", &it)) {
		while (rc && bson_iter_next(&it)) {
			char id[128];
			if (!sdb_bson_iter_doc(&it, &d))
				continue;
			str(&d, "id", id, sizeof id);
			if (strcmp(id, shard) == 0) {
				str(&d, "uri", out, n);
				rc = 0;
			}
		}
		if (rc)
			fprintf(stderr, "stripedb ctl shard: no shard '%s' (see ctl shard list)\n",
				shard);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(c);
	return rc;
}

/* `ctl shard list`: every shard of listShards with its members' status (a table, or one
 * JSON document {"shards": [...]} with --json). Returns: 0, 1 after the error line of a
 * failed listShards, or 2 (no metadata client). */
static int cmd_list(cli_ctx *ctx)
{
	mongoc_client_t *c = cli_meta_client(ctx);
	bson_t cmd = BSON_INITIALIZER, reply, d;
	bson_error_t e;
	bson_iter_t it;
	int rc = 0, first = 1;
	if (!c)
		return 2;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
		fprintf(stderr, "stripedb ctl shard list: %s\n", e.message);
		rc = 1;
		goto out;
	}
	if (ctx->json)
		printf("{\"shards\": [");
	else
		print_header();
	if (cli_iter_array(&reply, "shards", &it)) {
		while (bson_iter_next(&it)) {
			char id[128], uri[512];
			shardset_member m[SHARDSET_MAX];
			if (!sdb_bson_iter_doc(&it, &d))
				continue;
			str(&d, "id", id, sizeof id);
			str(&d, "uri", uri, sizeof uri);
			int n = shardset_status(uri, ctx->timeout_ms, m, SHARDSET_MAX);
			print_members(ctx->json, id, uri, m, n, &first);
		}
	}
	if (ctx->json)
		printf("]}\n");
out:
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(c);
	return rc;
}

static int member_usage(const char *msg)
{
	fprintf(stderr,
		"stripedb ctl shard member: %s (usage: shard member add SHARD ID --raft=H:P "
		"--wire=H:P | remove SHARD ID | transfer SHARD [ID] | status SHARD)\n",
		msg);
	return 2;
}

/* `ctl shard member add|remove|transfer|status` (argv after "member"). Returns: the exit
 * code (0, 1 cluster error, 2 usage via member_usage). */
static int cmd_member(cli_ctx *ctx, int argc, char **argv)
{
	const char *pos[4] = {0}, *raft = NULL, *wire = NULL;
	int npos = 0, rc;
	long long id = 0;
	char addr[1024], primary[256], hosts[SHARDSET_MAX][256], line[256];
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;

	for (int i = 0; i < argc; i++) {
		if (strncmp(argv[i], "--raft=", 7) == 0)
			raft = argv[i] + 7;
		else if (strncmp(argv[i], "--wire=", 7) == 0)
			wire = argv[i] + 7;
		else if (strcmp(argv[i], "--json") == 0)
			ctx->json = 1;
		else if (strncmp(argv[i], "--", 2) == 0)
			return member_usage("unknown option");
		else if (npos < 4)
			pos[npos++] = argv[i];
		else
			return member_usage("too many arguments");
	}
	if (npos < 2)
		return member_usage("missing verb or SHARD");
	const char *verb = pos[0];
	if (strcmp(verb, "add") == 0) {
		if (npos != 3 || cli_parse_id(pos[2], &id) != 0 || id == 0 || !raft || !wire)
			return member_usage("add needs SHARD, a positive ID, --raft=H:P and "
					    "--wire=H:P");
		BSON_APPEND_INT64(&cmd, "addMember", id);
		BSON_APPEND_UTF8(&cmd, "raft", raft);
		BSON_APPEND_UTF8(&cmd, "wire", wire);
		snprintf(line, sizeof line, "member %lld joined %s as a voter", id, pos[1]);
	} else if (strcmp(verb, "remove") == 0) {
		if (npos != 3 || cli_parse_id(pos[2], &id) != 0 || id == 0)
			return member_usage("remove needs SHARD and a positive ID");
		BSON_APPEND_INT64(&cmd, "removeMember", id);
		snprintf(line, sizeof line, "member %lld removed from %s", id, pos[1]);
	} else if (strcmp(verb, "transfer") == 0) {
		if (npos > 3 || (npos == 3 && cli_parse_id(pos[2], &id) != 0))
			return member_usage("transfer takes SHARD and an optional ID");
		BSON_APPEND_INT64(&cmd, "transferLeadership", id);
		snprintf(line, sizeof line, "primary of %s transferred", pos[1]);
	} else if (strcmp(verb, "status") == 0) {
		shardset_member m[SHARDSET_MAX];
		int first = 1;
		bson_destroy(&cmd);
		if (npos != 2)
			return member_usage("status takes SHARD");
		if ((rc = resolve(ctx, pos[1], addr, sizeof addr)) != 0 ||
		    (rc = check_set_name(addr, ctx->timeout_ms)) != 0)
			return rc;
		int n = shardset_status(addr, ctx->timeout_ms, m, SHARDSET_MAX);
		if (!ctx->json)
			print_header();
		print_members(ctx->json, pos[1], addr, m, n, &first);
		if (ctx->json)
			printf("\n");
		for (int i = 0; i < n; i++)
			if (!m[i].reachable)
				return 1;
		return n > 0 ? 0 : 1;
	} else {
		bson_destroy(&cmd);
		return member_usage("unknown verb");
	}
	if ((rc = resolve(ctx, pos[1], addr, sizeof addr)) != 0 ||
	    (rc = check_set_name(addr, ctx->timeout_ms)) != 0) {
		bson_destroy(&cmd);
		return rc;
	}
	all_hosts(addr, ctx->timeout_ms, hosts, SHARDSET_MAX, primary, sizeof primary);
	if (!primary[0]) {
		fprintf(stderr, "stripedb ctl shard member: no member of %s reachable at %s names a "
				"primary\n",
			pos[1], addr);
		bson_destroy(&cmd);
		return 1;
	}
	mongoc_client_t *c = direct_client(primary, ctx->timeout_ms);
	if (!c) {
		fprintf(stderr, "stripedb ctl shard member: bad primary address '%s'\n", primary);
		bson_destroy(&cmd);
		return 1;
	}
	rc = 0;
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
		fprintf(stderr, "stripedb ctl shard member: %s\n", e.message);
		rc = 1;
	} else if (ctx->json) {
		char *j = bson_as_relaxed_extended_json(&reply, NULL);
		printf("%s\n", j);
		bson_free(j);
	} else {
		printf("%s\n", line);
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(c);
	return rc;
}

int cli_shardset_main(cli_ctx *ctx, int argc, char **argv)
{
	if (argc > 0 && strcmp(argv[0], "list") == 0) {
		for (int i = 1; i < argc; i++) {
			if (strcmp(argv[i], "--json") == 0)
				ctx->json = 1;
			else {
				fprintf(stderr, "stripedb ctl shard list: unexpected argument '%s'\n",
					argv[i]);
				return 2;
			}
		}
		return cmd_list(ctx);
	}
	if (argc > 0 && strcmp(argv[0], "member") == 0)
		return cmd_member(ctx, argc - 1, argv + 1);
	fprintf(stderr, "stripedb ctl shard: expected list or member\n");
	return 2;
}
