/* `stripedb ctl`: the operator CLI. See cli.h.
 *
 * Global options (before the subcommand): --metadata=H:P,... (or STRIPEDB_METADATA),
 * --json, --timeout-ms=N. Subcommands talk to the metadata service through libmongoc.
 */
#include "cli/cli.h"

#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/config.h"
#include "common/err.h"
#include "common/metauri.h"

int cli_cdc_main(cli_ctx *ctx, int argc, char **argv); /* cli/cdc.c */
int cli_backup_main(cli_ctx *ctx, int argc, char **argv);  /* cli/backup.c */
int cli_restore_main(cli_ctx *ctx, int argc, char **argv); /* cli/backup.c */
int cli_migrate_main(cli_ctx *ctx, int argc, char **argv);   /* cli/migrate.c */
int cli_migration_main(cli_ctx *ctx, int argc, char **argv); /* cli/migrate.c */
int cli_shard_main(cli_ctx *ctx, int argc, char **argv);     /* cli/migrate.c: drain, split */
int cli_top_main(cli_ctx *ctx, int argc, char **argv);       /* cli/top.c */
int cli_chunk_main(cli_ctx *ctx, int argc, char **argv);     /* cli/migrate.c */
int cli_rebalance_main(cli_ctx *ctx, int argc, char **argv); /* cli/migrate.c */
int cli_tenant_main(cli_ctx *ctx, int argc, char **argv);    /* cli/migrate.c: isolate */
int cli_metadata_cmd(cli_ctx *ctx, int argc, char **argv);   /* cli/metadata.c */
int cli_tenant_cmd(cli_ctx *ctx, int argc, char **argv);     /* cli/tenant.c */
int cli_user_cmd(cli_ctx *ctx, int argc, char **argv);       /* cli/tenant.c */
int cli_ratelimit_cmd(cli_ctx *ctx, int argc, char **argv);  /* cli/ratelimit.c */
int cli_cluster_main(int argc, char **argv);                 /* cli/cluster.c: no --metadata */
int cli_db_cmd(cli_ctx *ctx, int argc, char **argv);         /* cli/catalog.c */
int cli_collection_cmd(cli_ctx *ctx, int argc, char **argv); /* cli/catalog.c */

static void ctl_usage(FILE *f)
{
	fprintf(f,
		"usage: stripedb ctl [--metadata=H:P,...] [--json] [--timeout-ms=N]\n"
		"                    [--cluster-key-file=PATH] SUBCOMMAND ...\n"
		"       (--json may also follow the subcommand and its arguments)\n"
		"\n"
		"subcommands:\n"
		"  ping                                    hello to every metadata member; who leads\n"
		"  metadata join|remove|transfer|status    Raft membership of the metadata service\n"
		"  shard drain|split ...                   move every / half of a shard's chunks\n"
		"  shard list                              every shard's replica-set members\n"
		"  shard add ID URI | shard remove ID      register / unregister a shard\n"
		"  db create NAME [--tenant T] | db list   databases\n"
		"  collection create|list|drop ...         sharded collections (shard key, chunks)\n"
		"  shard member add|remove|transfer|status membership of a shard replica set\n"
		"  migrate DB.COLL --chunk ID --to SHARD [--wait] [--dry-run]\n"
		"  migrate DB.COLL --chunks A,B --to SHARD | --filter JSON --to SHARD | --plan FILE\n"
		"  migration list|status|rollback|pause|resume ...   migrations in flight and done\n"
		"  chunk list|split|merge ...              chunks of a sharded collection\n"
		"  rebalance --bin-pack                    propose and run drains of cold shards\n"
		"  top [--once]                            shards and migrations, live\n"
		"  cdc status|read ...                     change data capture per shard\n"
		"  backup create|list|delete ...           shard snapshots in the CDC archive\n"
		"  restore DB.COLL --to-time=TIME ...      point-in-time restore of a collection\n"
		"  tenant create|list|quota|policy|isolate ...   tenants, quotas, policies\n"
		"  user create|passwd|drop ...             users (SCRAM-SHA-256 verifiers)\n"
		"  ratelimit peers                         the rate-limit peer ring in metadata\n"
		"  cluster bootstrap|status|config ...     build a cluster on bare hosts over SSH\n"
		"See stripedb-ctl(1) for every subcommand's options.\n"
		"\n"
		"--metadata defaults to STRIPEDB_METADATA, --cluster-key-file to\n"
		"STRIPEDB_CLUSTER_KEY_FILE (needed when the cluster runs with a cluster key).\n"
		"Exit codes: 0 ok, 1 error from the\n"
		"cluster or unreachable, 2 bad usage.\n");
}

bool cli_iter_array(const bson_t *d, const char *key, bson_iter_t *out)
{
	bson_iter_t it;

	return bson_iter_init_find(&it, d, key) && BSON_ITER_HOLDS_ARRAY(&it) &&
	       bson_iter_recurse(&it, out);
}

void cli_print_json(const bson_t *d)
{
	char *j = bson_as_relaxed_extended_json(d, NULL);
	printf("%s\n", j);
	bson_free(j);
}

int cli_parse_id(const char *s, long long *out)
{
	char *end = NULL;
	long long v = strtoll(s, &end, 10);
	if (!end || *end || v < 0)
		return -1;
	*out = v;
	return 0;
}

void cli_rs_uri_begin(cli_rs_uri *u, char *buf, size_t n)
{
	u->buf = buf;
	u->n = n;
	u->members = 0;
	u->len = (size_t)snprintf(buf, n, "mongodb://");
}

void cli_rs_uri_add(cli_rs_uri *u, const char *host, int port)
{
	if (u->len < u->n)
		u->len += (size_t)snprintf(u->buf + u->len, u->n - u->len, "%s%s:%d",
					   u->members ? "," : "", host, port);
	u->members++;
}

void cli_rs_uri_end(cli_rs_uri *u, const char *set)
{
	if (u->len < u->n)
		snprintf(u->buf + u->len, u->n - u->len, "/?replicaSet=%s", set);
}

void cli_archive_env(const char **cdc, const char **archive, const char **s3_endpoint,
		     const char **s3_region, const char **s3_credentials_file)
{
	*cdc = getenv("STRIPEDB_CDC");
	*archive = getenv("STRIPEDB_ARCHIVE");
	*s3_endpoint = getenv("STRIPEDB_S3_ENDPOINT");
	*s3_region = getenv("STRIPEDB_S3_REGION");
	*s3_credentials_file = getenv("STRIPEDB_S3_CREDENTIALS_FILE");
}

struct _mongoc_client_t *cli_meta_client(const cli_ctx *ctx)
{
	char *u;
	mongoc_client_t *c;

	if (ctx->metadata == NULL || ctx->metadata[0] == '\0') {
		fprintf(stderr, "stripedb ctl: --metadata=H:P,... (or STRIPEDB_METADATA) is required\n");
		return NULL;
	}
	u = sdb_meta_uri(ctx->metadata, false, ctx->timeout_ms, ctx->timeout_ms, 0);
	c = auth_cluster_client_new(u);
	free(u);
	if (c)
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	else
		fprintf(stderr, "stripedb ctl: bad metadata address '%s'\n", ctx->metadata);
	return c;
}

int cli_meta_run(const cli_ctx *ctx, const bson_t *cmd, bson_t *reply)
{
	mongoc_client_t *c = cli_meta_client(ctx);
	bson_error_t e;
	int rc = 1;

	bson_init(reply);
	if (!c)
		return 1;
	bson_destroy(reply);
	if (mongoc_client_command_simple(c, "admin", cmd, NULL, reply, &e))
		rc = 0;
	else
		fprintf(stderr, "stripedb ctl: %s\n", e.message);
	mongoc_client_destroy(c);
	return rc;
}

int cli_meta_simple(const cli_ctx *ctx, bson_t *cmd, const char *done)
{
	bson_t reply;
	int rc = cli_meta_run(ctx, cmd, &reply);

	if (rc == 0)
		printf("%s\n", ctx->json ? "{\"ok\": true}" : done);
	bson_destroy(&reply);
	bson_destroy(cmd);
	return rc;
}

/* ping: hello to each member, report its role in the replica set. */
static int cmd_ping(cli_ctx *ctx, int argc, char **argv)
{
	char *list;
	char *save = NULL;
	int failures = 0;

	if (argc != 0) {
		fprintf(stderr, "stripedb ctl ping: unexpected argument '%s'\n", argv[0]);
		return 2;
	}
	list = sdb_strdup(ctx->metadata);
	for (char *tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		char *uri;
		mongoc_client_t *c;
		bson_t cmd = BSON_INITIALIZER, reply;
		bson_error_t e;
		bson_iter_t it;

		uri = sdb_meta_uri(tok, true, ctx->timeout_ms, ctx->timeout_ms, 0);
		c = auth_cluster_client_new(uri);
		free(uri);
		if (c == NULL) {
			fprintf(stderr, "stripedb ctl: bad metadata address '%s'\n", tok);
			failures++;
			continue;
		}
		BSON_APPEND_INT32(&cmd, "hello", 1);
		if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
			if (ctx->json) {
				printf("{\"member\": \"%s\", \"ok\": false, \"error\": \"%s\"}\n", tok,
				       e.message);
			} else {
				printf("%-24s unreachable: %s\n", tok, e.message);
			}
			failures++;
		} else {
			const char *state = "member";
			if (bson_iter_init_find(&it, &reply, "isWritablePrimary") &&
			    bson_iter_as_bool(&it)) {
				state = "leader";
			} else if (bson_iter_init_find(&it, &reply, "secondary") &&
				   bson_iter_as_bool(&it)) {
				state = "follower";
			}
			if (ctx->json) {
				printf("{\"member\": \"%s\", \"ok\": true, \"state\": \"%s\"}\n", tok,
				       state);
			} else {
				printf("%-24s %s\n", tok, state);
			}
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
		mongoc_client_destroy(c);
	}
	free(list);
	return failures == 0 ? 0 : 1;
}

/* libmongoc's own log lines (e.g. "Couldn't send endSessions" at client destruction after a
 * refused command) would add lines to stderr after the one error line ctl promises: the
 * command's outcome is reported through its bson_error_t instead. */
static void mongoc_log_drop(mongoc_log_level_t level, const char *domain, const char *message,
			    void *data)
{
	(void)level;
	(void)domain;
	(void)message;
	(void)data;
}

static const struct {
	const char *name;
	cli_cmd_fn fn;
} cmds[] = {
	{"ping", cmd_ping},
	{"cdc", cli_cdc_main},
	{"backup", cli_backup_main},
	{"restore", cli_restore_main},
	{"migrate", cli_migrate_main},
	{"migration", cli_migration_main},
	{"shard", cli_shard_main},
	{"top", cli_top_main},
	{"chunk", cli_chunk_main},
	{"db", cli_db_cmd},                 /* cli/catalog.c */
	{"collection", cli_collection_cmd}, /* cli/catalog.c */
	{"rebalance", cli_rebalance_main},
	{"tenant", cli_tenant_cmd}, /* cli/tenant.c: create/list/quota/policy, else isolate */
	{"user", cli_user_cmd},     /* cli/tenant.c */
	{"metadata", cli_metadata_cmd},
	{"ratelimit", cli_ratelimit_cmd},
};

int cli_main(int argc, char **argv)
{
	cli_ctx ctx = {.metadata = getenv("STRIPEDB_METADATA"), .json = 0, .timeout_ms = 5000};
	const char *key_file = getenv("STRIPEDB_CLUSTER_KEY_FILE");
	int i = 0;
	int rc;

	for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--help") == 0) {
			ctl_usage(stdout);
			return 0;
		} else if (strcmp(a, "--json") == 0) {
			ctx.json = 1;
		} else if (strncmp(a, "--metadata=", 11) == 0) {
			ctx.metadata = a + 11;
		} else if (strncmp(a, "--cluster-key-file=", 19) == 0) {
			key_file = a + 19;
		} else if (strncmp(a, "--timeout-ms=", 13) == 0) {
			char *end;
			long v = strtol(a + 13, &end, 10);
			if (*end != '\0' || v <= 0) {
				fprintf(stderr, "stripedb ctl: --timeout-ms: '%s' is not a positive integer\n",
					a + 13);
				return 2;
			}
			ctx.timeout_ms = (int)v;
		} else {
			fprintf(stderr, "stripedb ctl: unknown flag %s (see stripedb ctl --help)\n", a);
			return 2;
		}
	}
	if (i == argc) {
		fprintf(stderr, "stripedb ctl: missing subcommand (see stripedb ctl --help)\n");
		return 2;
	}
	if (strcmp(argv[i], "cluster") == 0) { /* the spec names the hosts: no --metadata */
		return cli_cluster_main(argc - i - 1, argv + i + 1);
	}
	/* issue #10: with the key loaded, every client made by auth_cluster_client_new
	 * authenticates as a cluster member (metadata and shards refuse ctl otherwise). */
	if (key_file != NULL && key_file[0] != '\0') {
		char kerr[300];
		if (auth_cluster_load(key_file, kerr, sizeof kerr) != 0) {
			fprintf(stderr, "stripedb ctl: %s\n", kerr);
			return 2;
		}
	}
	{
		/* TLS to the cluster's internal listeners: STRIPEDB_TLS_INTERNAL, _CA, _CERT,
		 * _KEY, as the roles' own options (issue #10) */
		char terr[300];
		if (auth_cluster_tls_setup_env(terr, sizeof terr) != 0) {
			fprintf(stderr, "stripedb ctl: %s\n", terr);
			return 2;
		}
	}
	/* --json may also follow the subcommand (`ctl collection list --json`, as users write
	 * it; it was taken for a database name): taken out of the subcommand's arguments.
	 * `metadata` parses its own flags. */
	if (strcmp(argv[i], "metadata") != 0) {
		int out = i + 1;
		for (int j = i + 1; j < argc; j++) {
			if (strcmp(argv[j], "--json") == 0)
				ctx.json = 1;
			else
				argv[out++] = argv[j];
		}
		argc = out;
	}
	for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
		if (strcmp(cmds[k].name, argv[i]) == 0) {
			char *list, *save = NULL;
			int bad = 0;
			/* `shard member ... SHARD` with SHARD given as the set's address needs no
			 * metadata (cli/shardset.c asks for it when SHARD is a registered id) */
			int no_meta_ok = strcmp(argv[i], "shard") == 0 && i + 1 < argc &&
					 strcmp(argv[i + 1], "member") == 0;
			if ((ctx.metadata == NULL || ctx.metadata[0] == '\0') && !no_meta_ok) {
				fprintf(stderr, "stripedb ctl: no metadata address: pass --metadata=H:P,... "
						"or set STRIPEDB_METADATA\n");
				return 2;
			}
			list = sdb_strdup(ctx.metadata ? ctx.metadata : "");
			for (char *tok = strtok_r(list, ",", &save); tok != NULL && !bad;
			     tok = strtok_r(NULL, ",", &save)) {
				char host[256], err[256];
				int port;
				if (sdb_addr_split(tok, host, sizeof host, &port, err, sizeof err) != 0) {
					fprintf(stderr, "stripedb ctl: --metadata: %s\n", err);
					bad = 1;
				}
			}
			free(list);
			if (bad) {
				return 2;
			}
			mongoc_init();
			mongoc_log_set_handler(mongoc_log_drop, NULL);
			rc = cmds[k].fn(&ctx, argc - i - 1, argv + i + 1);
			mongoc_cleanup();
			return rc;
		}
	}
	fprintf(stderr, "stripedb ctl: unknown subcommand '%s' (see stripedb ctl --help)\n", argv[i]);
	return 2;
}
