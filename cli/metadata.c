/* `stripedb ctl metadata join|remove|transfer|status`: membership of the metadata Raft
 * group (issue #5; commands in src/metadata/README.md).
 *
 *   stripedb ctl metadata join ID --raft=H:P --wire=H:P   add a fresh member (started
 *                                                          without --bootstrap-members)
 *   stripedb ctl metadata remove ID                       remove a member
 *   stripedb ctl metadata transfer [ID]                   hand leadership to ID (or any)
 *   stripedb ctl metadata status                          every member's raft view
 *   stripedb ctl metadata op-version N                    raise the cluster op version
 *                                                          (raft/migstate.h) once every
 *                                                          member runs a binary knowing N
 *
 * Entry points for cli/ctl.c (either one):
 *   cli_metadata_cmd(ctx, argc, argv): the shape of ctl.c's subcommand table (cli_cmd_fn),
 *     argv after "metadata", global options from ctx;
 *   cli_metadata_main(argc, argv): argv[0] == "metadata"; options --metadata=H:P,...
 *     (default $STRIPEDB_METADATA), --json and --timeout-ms=N anywhere in argv.
 * Exit codes: 0 ok, 1 the cluster answered with an error or was unreachable, 2 bad usage.
 */
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/metauri.h"

int cli_metadata_main(int argc, char **argv);

typedef struct mctx {
	const char *metadata;
	int json;
	long timeout_ms;
	const char *raft;
	const char *wire;
	char *pos[4];
	int npos;
} mctx;

static int usage(const char *msg)
{
	fprintf(stderr, "stripedb ctl metadata: %s (usage: metadata join ID --raft=H:P --wire=H:P | "
			"remove ID | transfer [ID] | status | op-version N)\n",
		msg);
	return 2;
}

static mongoc_client_t *client_for(const mctx *c, const char *hosts, int direct)
{
	char *uri = sdb_meta_uri(hosts, direct, (int)c->timeout_ms, (int)c->timeout_ms,
				 (int)(c->timeout_ms * 3));
	mongoc_client_t *cl = auth_cluster_client_new(uri);
	free(uri);
	if (cl)
		mongoc_client_set_error_api(cl, MONGOC_ERROR_API_VERSION_2);
	return cl;
}

static void print_doc(const mctx *c, const bson_t *doc, const char *text)
{
	if (c->json) {
		char *j = bson_as_relaxed_extended_json(doc, NULL);
		printf("%s\n", j);
		bson_free(j);
	} else if (text) {
		printf("%s\n", text);
	}
}

/* Run cmd on the leader (driver server selection finds it). */
static int run_on_leader(const mctx *c, bson_t *cmd, bson_t *reply)
{
	bson_error_t e;
	mongoc_client_t *cl = client_for(c, c->metadata, 0);
	int ok;
	if (!cl) {
		bson_init(reply);
		fprintf(stderr, "stripedb ctl metadata: bad --metadata '%s'\n", c->metadata);
		return 2;
	}
	ok = mongoc_client_command_simple(cl, "admin", cmd, NULL, reply, &e);
	mongoc_client_destroy(cl);
	if (!ok) {
		fprintf(stderr, "stripedb ctl metadata: %s\n", e.message);
		return 1;
	}
	return 0;
}

static int cmd_status(const mctx *c)
{
	char *list = sdb_strdup(c->metadata), *save = NULL, *tok;
	int rc = 0;
	if (!c->json)
		printf("%-22s %-4s %-10s %-6s %-6s %-8s %-8s %s\n", "member", "id", "state", "ready",
		       "term", "leader", "applied", "hash");
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		mongoc_client_t *cl = client_for(c, tok, 1);
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		bson_iter_t it;
		BSON_APPEND_INT32(&cmd, "metadataStatus", 1);
		if (!cl || !mongoc_client_command_simple(cl, "admin", &cmd, NULL, &reply, &e)) {
			if (c->json)
				printf("{\"member\": \"%s\", \"error\": \"unreachable\"}\n", tok);
			else
				printf("%-22s unreachable: %s\n", tok, cl ? e.message : "bad address");
			rc = 1;
			if (cl)
				bson_destroy(&reply);
		} else {
			if (c->json) {
				print_doc(c, &reply, NULL);
			} else {
				long long id = 0, term = 0, leader = 0, applied = 0;
				const char *state = "?", *hash = "?";
				bool ready = false;
				if (bson_iter_init_find(&it, &reply, "id"))
					id = bson_iter_as_int64(&it);
				if (bson_iter_init_find(&it, &reply, "term"))
					term = bson_iter_as_int64(&it);
				if (bson_iter_init_find(&it, &reply, "leaderId"))
					leader = bson_iter_as_int64(&it);
				if (bson_iter_init_find(&it, &reply, "lastApplied"))
					applied = bson_iter_as_int64(&it);
				if (bson_iter_init_find(&it, &reply, "state") && BSON_ITER_HOLDS_UTF8(&it))
					state = bson_iter_utf8(&it, NULL);
				if (bson_iter_init_find(&it, &reply, "ready"))
					ready = bson_iter_as_bool(&it);
				if (bson_iter_init_find(&it, &reply, "stateHash") && BSON_ITER_HOLDS_UTF8(&it))
					hash = bson_iter_utf8(&it, NULL);
				printf("%-22s %-4lld %-10s %-6s %-6lld %-8lld %-8lld %s\n", tok, id, state,
				       ready ? "yes" : "no", term, leader, applied, hash);
			}
			bson_destroy(&reply);
		}
		bson_destroy(&cmd);
		if (cl)
			mongoc_client_destroy(cl);
	}
	free(list);
	return rc;
}

/* Parse argv[from..] into c (options anywhere, up to 4 positional words). */
static int parse_args(mctx *c, int argc, char **argv, int from)
{
	for (int i = from; i < argc; i++) {
		const char *a = argv[i];
		if (strncmp(a, "--metadata=", 11) == 0)
			c->metadata = a + 11;
		else if (strcmp(a, "--json") == 0)
			c->json = 1;
		else if (strncmp(a, "--timeout-ms=", 13) == 0)
			c->timeout_ms = strtol(a + 13, NULL, 10);
		else if (strncmp(a, "--raft=", 7) == 0)
			c->raft = a + 7;
		else if (strncmp(a, "--wire=", 7) == 0)
			c->wire = a + 7;
		else if (strncmp(a, "--", 2) == 0)
			return usage("unknown option");
		else if (c->npos < 4)
			c->pos[c->npos++] = argv[i];
		else
			return usage("too many arguments");
	}
	return 0;
}

static int run_sub(mctx *c)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	long long id = 0;
	int rc;
	char line[256];

	if (c->npos == 0)
		return usage("missing subcommand");
	if (!c->metadata || !*c->metadata)
		return usage("no metadata address: pass --metadata=H:P,... or set STRIPEDB_METADATA");
	if (c->timeout_ms <= 0)
		return usage("--timeout-ms must be positive");
	mongoc_init();
	if (strcmp(c->pos[0], "status") == 0) {
		if (c->npos != 1)
			return usage("status takes no argument");
		return cmd_status(c);
	}
	if (strcmp(c->pos[0], "join") == 0) {
		if (c->npos != 2 || cli_parse_id(c->pos[1], &id) != 0 || id == 0 || !c->raft)
			return usage("join needs ID and --raft=H:P (and --wire=H:P)");
		BSON_APPEND_INT64(&cmd, "addMember", id);
		BSON_APPEND_UTF8(&cmd, "raft", c->raft);
		if (c->wire)
			BSON_APPEND_UTF8(&cmd, "wire", c->wire);
		snprintf(line, sizeof line, "member %lld joined as a voter", id);
	} else if (strcmp(c->pos[0], "remove") == 0) {
		if (c->npos != 2 || cli_parse_id(c->pos[1], &id) != 0 || id == 0)
			return usage("remove needs ID");
		BSON_APPEND_INT64(&cmd, "removeMember", id);
		snprintf(line, sizeof line, "member %lld removed", id);
	} else if (strcmp(c->pos[0], "transfer") == 0) {
		if (c->npos > 2 || (c->npos == 2 && cli_parse_id(c->pos[1], &id) != 0))
			return usage("transfer takes an optional ID");
		BSON_APPEND_INT64(&cmd, "transferLeadership", id);
		snprintf(line, sizeof line, "leadership transferred");
	} else if (strcmp(c->pos[0], "op-version") == 0) {
		if (c->npos != 2 || cli_parse_id(c->pos[1], &id) != 0 || id < 2)
			return usage("op-version needs N (2 or more)");
		BSON_APPEND_INT64(&cmd, "setOpVersion", id);
		snprintf(line, sizeof line, "cluster op version %lld", id);
	} else {
		bson_destroy(&cmd);
		return usage("unknown subcommand");
	}
	rc = run_on_leader(c, &cmd, &reply);
	if (rc == 0)
		print_doc(c, &reply, line);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

int cli_metadata_main(int argc, char **argv)
{
	mctx c = {.metadata = getenv("STRIPEDB_METADATA"), .timeout_ms = 5000};
	int rc = parse_args(&c, argc, argv, 1);
	return rc != 0 ? rc : run_sub(&c);
}

/* The same with ctl's parsed global options, in the shape of ctl.c's subcommand table
 * (cli_cmd_fn): argv starts after "metadata". */
int cli_metadata_cmd(struct cli_ctx *ctx, int argc, char **argv);

int cli_metadata_cmd(struct cli_ctx *ctx, int argc, char **argv)
{
	mctx c = {.metadata = ctx->metadata, .json = ctx->json, .timeout_ms = ctx->timeout_ms};
	int rc = parse_args(&c, argc, argv, 0);
	return rc != 0 ? rc : run_sub(&c);
}
