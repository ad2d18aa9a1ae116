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

int shardset_status(const char *addr, int timeout_ms, shardset_member *out, int max)
{
	char hosts[SHARDSET_MAX][256];
	int n = all_hosts(addr, timeout_ms, hosts, SHARDSET_MAX, NULL, 0);
	int64_t primary_applied = -1;
	if (n > max)
		n = max;
	for (int i = 0; i < n; i++) {
		shardset_member *m = &out[i];
		mongoc_client_t *c = direct_client(hosts[i], timeout_ms);
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		memset(m, 0, sizeof *m);
		snprintf(m->host, sizeof m->host, "%.255s", hosts[i]);
		m->lag = -1;
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
			if (m->is_primary)
				primary_applied = m->applied;
		}
		if (c) {
			bson_destroy(&reply);
			mongoc_client_destroy(c);
		}
		bson_destroy(&cmd);
	}
	for (int i = 0; i < n; i++)
		if (out[i].reachable && primary_applied >= 0)
			out[i].lag = primary_applied > out[i].applied ? primary_applied - out[i].applied
								      : 0;
	return n;
}

/* ------------------------------------------------------------------ printing */

static void print_header(void)
{
	printf("%-12s %-22s %-4s %-12s %-6s %-9s %-9s %-7s %s\n", "SHARD", "MEMBER", "ID", "STATE",
	       "TERM", "APPLIED", "COMMIT", "LAG", "PRIMARY");
}

static void print_members(int json, const char *shard, const char *uri, const shardset_member *m,
			  int n, int *first)
{
	if (json) {
		printf("%s{\"id\": \"%s\", \"uri\": \"%s\", \"members\": [", *first ? "" : ", ", shard,
		       uri);
		for (int i = 0; i < n; i++) {
			if (!m[i].reachable) {
				printf("%s{\"host\": \"%s\", \"reachable\": false}", i ? ", " : "",
				       m[i].host);
				continue;
			}
			printf("%s{\"host\": \"%s\", \"reachable\": true, \"setName\": \"%s\", \"id\": "
			       "%" PRId64 ", \"state\": \"%s\", \"term\": %" PRId64
			       ", \"applied\": %" PRId64 ", \"commitIndex\": %" PRId64
			       ", \"lag\": %" PRId64 ", \"primary\": %s, \"primaryId\": %" PRId64 "}",
			       i ? ", " : "", m[i].host, m[i].set, m[i].id, m[i].state, m[i].term,
			       m[i].applied, m[i].commit, m[i].lag, m[i].is_primary ? "true" : "false",
			       m[i].primary_id);
		}
		printf("]}");
		*first = 0;
		return;
	}
	for (int i = 0; i < n; i++) {
		if (!m[i].reachable) {
			printf("%-12s %-22s %-4s %-12s\n", shard, m[i].host, "-", "UNREACHABLE");
			continue;
		}
		char lag[24];
		if (m[i].lag >= 0)
			snprintf(lag, sizeof lag, "%" PRId64, m[i].lag);
		else
			snprintf(lag, sizeof lag, "-");
		printf("%-12s %-22s %-4" PRId64 " %-12s %-6" PRId64 " %-9" PRId64 " %-9" PRId64
		       " %-7s %s\n",
		       shard, m[i].host, m[i].id, m[i].state, m[i].term, m[i].applied, m[i].commit, lag,
		       m[i].is_primary ? "*" : "");
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

static int resolve(cli_ctx *ctx, const char *shard, char *out, size_t n)
{
	if (strncmp(shard, "mongodb://", 10) == 0 || strchr(shard, ':')) {
		snprintf(out, n, "%s", shard);
		return 0;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	bson_t cmd = BSON_INITIALIZER, reply, arr, d;
	bson_error_t e;
	bson_iter_t it;
	int rc = 1;
	if (!c)
		return 2;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
		fprintf(stderr, "stripedb ctl shard: listShards: %s\n", e.message);
	} else if (bson_iter_init_find(&it, &reply, "shards") && BSON_ITER_HOLDS_ARRAY(&it)) {
		const uint8_t *data;
		uint32_t len;
		bson_iter_array(&it, &len, &data);
		if (bson_init_static(&arr, data, len) && bson_iter_init(&it, &arr))
			while (rc && bson_iter_next(&it)) {
				char id[128];
				if (!BSON_ITER_HOLDS_DOCUMENT(&it))
					continue;
				bson_iter_document(&it, &len, &data);
				if (!bson_init_static(&d, data, len))
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

static int cmd_list(cli_ctx *ctx)
{
	mongoc_client_t *c = cli_meta_client(ctx);
	bson_t cmd = BSON_INITIALIZER, reply, arr, d;
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
	if (bson_iter_init_find(&it, &reply, "shards") && BSON_ITER_HOLDS_ARRAY(&it)) {
		const uint8_t *data;
		uint32_t len;
		bson_iter_array(&it, &len, &data);
		if (bson_init_static(&arr, data, len) && bson_iter_init(&it, &arr))
			while (bson_iter_next(&it)) {
				char id[128], uri[512];
				shardset_member m[SHARDSET_MAX];
				if (!BSON_ITER_HOLDS_DOCUMENT(&it))
					continue;
				bson_iter_document(&it, &len, &data);
				if (!bson_init_static(&d, data, len))
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

static int parse_id(const char *s, long long *out)
{
	char *end = NULL;
	long long v = strtoll(s, &end, 10);
	if (!end || *end || v < 0)
		return -1;
	*out = v;
	return 0;
}

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
		if (npos != 3 || parse_id(pos[2], &id) != 0 || id == 0 || !raft || !wire)
			return member_usage("add needs SHARD, a positive ID, --raft=H:P and "
					    "--wire=H:P");
		BSON_APPEND_INT64(&cmd, "addMember", id);
		BSON_APPEND_UTF8(&cmd, "raft", raft);
		BSON_APPEND_UTF8(&cmd, "wire", wire);
		snprintf(line, sizeof line, "member %lld joined %s as a voter", id, pos[1]);
	} else if (strcmp(verb, "remove") == 0) {
		if (npos != 3 || parse_id(pos[2], &id) != 0 || id == 0)
			return member_usage("remove needs SHARD and a positive ID");
		BSON_APPEND_INT64(&cmd, "removeMember", id);
		snprintf(line, sizeof line, "member %lld removed from %s", id, pos[1]);
	} else if (strcmp(verb, "transfer") == 0) {
		if (npos > 3 || (npos == 3 && parse_id(pos[2], &id) != 0))
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
