/* `stripedb ctl tenant create|list|quota|policy` and `ctl user create|passwd|drop`
 * (issue #10, DESIGN.md §3a). Other `tenant` verbs (isolate) go to cli/migrate.c.
 *
 * Talks to the metadata leader (replica set URI) through cli_meta_client, which carries
 * the cluster key and internal TLS that `stripedb ctl` loaded (cli/ctl.c).
 *   tenant create NAME                       {createTenant: NAME}
 *   tenant list                              {listTenants: 1}
 *   tenant quota NAME JSON                   {setQuota: NAME, quota: JSON}
 *   tenant policy NAME JSON                  {setPolicy: NAME, policy: JSON}
 *   user create NAME --tenant T --password P {createUser: NAME, tenant: T, password: P}
 *     (the leader stores a SCRAM-SHA-256 verifier, never the password)
 *   user passwd NAME --password P            {updateUser: NAME, password: P}
 *   user drop NAME                           {dropUser: NAME}
 * The password may also come from STRIPEDB_PASSWORD (keeps it out of `ps`).
 */
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "cli/cli.h"
#include "common/alloc.h"

int cli_tenant_main(cli_ctx *ctx, int argc, char **argv); /* cli/migrate.c: isolate */
int cli_tenant_cmd(cli_ctx *ctx, int argc, char **argv);
int cli_user_cmd(cli_ctx *ctx, int argc, char **argv);

static void tenant_usage(FILE *f)
{
	fprintf(f, "usage: stripedb ctl tenant create NAME | list | quota NAME JSON | policy NAME JSON\n"
		   "       stripedb ctl tenant isolate ...   (see its --help)\n"
		   "quota JSON: {\"requestsPerSec\": N, \"docsWrittenPerSec\": N, \"bytesPerSec\": N,"
		   " \"periodMS\": P}\n"
		   "policy JSON: {\"databases\": [...], \"actions\": [\"find\", \"insert\", \"update\","
		   " \"remove\", \"createIndex\", \"admin\"], \"collections\": {\"db.coll\": "
		   "{\"actions\": [...]}}}\n");
}

/* `ctl tenant list`: listTenants as a TENANT/QUOTA/POLICY table, or one JSON line a
 * tenant with --json. Returns: the exit code of cli_meta_run (0 or 1). */
static int tenant_list(cli_ctx *ctx)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_iter_t it, arr;
	int rc;

	BSON_APPEND_INT32(&cmd, "listTenants", 1);
	rc = cli_meta_run(ctx, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc == 0 && bson_iter_init_find(&it, &reply, "tenants") && bson_iter_recurse(&it, &arr)) {
		if (!ctx->json)
			printf("%-20s %-40s %s\n", "TENANT", "QUOTA", "POLICY");
		while (bson_iter_next(&arr)) {
			bson_t d, sub;
			bson_iter_t f;
			char *q = NULL, *p = NULL;
			const char *name = "?";
			if (!sdb_bson_iter_doc(&arr, &d))
				continue;
			if (ctx->json) {
				cli_print_json(&d);
				continue;
			}
			if (bson_iter_init_find(&f, &d, "name") && BSON_ITER_HOLDS_UTF8(&f))
				name = bson_iter_utf8(&f, NULL);
			if (bson_iter_init_find(&f, &d, "quota") && sdb_bson_iter_doc(&f, &sub))
				q = bson_as_relaxed_extended_json(&sub, NULL);
			if (bson_iter_init_find(&f, &d, "policy") && sdb_bson_iter_doc(&f, &sub))
				p = bson_as_relaxed_extended_json(&sub, NULL);
			printf("%-20s %-40s %s\n", name, q ? q : "-", p ? p : "-");
			bson_free(q);
			bson_free(p);
		}
	}
	bson_destroy(&reply);
	return rc;
}

int cli_tenant_cmd(cli_ctx *ctx, int argc, char **argv)
{
	const char *verb = argc > 0 ? argv[0] : NULL;

	if (!verb || strcmp(verb, "--help") == 0) {
		tenant_usage(verb ? stdout : stderr);
		return verb ? 0 : 2;
	}
	if (strcmp(verb, "create") == 0) {
		if (argc != 2 || argv[1][0] == '\0' || argv[1][0] == '-') {
			fprintf(stderr, "stripedb ctl tenant create: needs exactly one NAME\n");
			return 2;
		}
		bson_t *cmd = BCON_NEW("createTenant", BCON_UTF8(argv[1]));
		bson_t c;
		bson_copy_to(cmd, &c);
		bson_destroy(cmd);
		char msg[300];
		snprintf(msg, sizeof msg, "tenant %s created", argv[1]);
		return cli_meta_simple(ctx, &c, msg);
	}
	if (strcmp(verb, "list") == 0) {
		if (argc != 1) {
			fprintf(stderr, "stripedb ctl tenant list: unexpected argument '%s'\n", argv[1]);
			return 2;
		}
		return tenant_list(ctx);
	}
	if (strcmp(verb, "quota") == 0 || strcmp(verb, "policy") == 0) {
		bool quota = verb[0] == 'q';
		bson_error_t e;
		bson_t doc, cmd = BSON_INITIALIZER;
		char msg[300];
		if (argc != 3) {
			fprintf(stderr, "stripedb ctl tenant %s: needs NAME and a JSON document\n", verb);
			return 2;
		}
		if (!bson_init_from_json(&doc, argv[2], -1, &e)) {
			fprintf(stderr, "stripedb ctl tenant %s: bad JSON: %s\n", verb, e.message);
			return 2;
		}
		BSON_APPEND_UTF8(&cmd, quota ? "setQuota" : "setPolicy", argv[1]);
		BSON_APPEND_DOCUMENT(&cmd, quota ? "quota" : "policy", &doc);
		bson_destroy(&doc);
		snprintf(msg, sizeof msg, "tenant %s: %s set", argv[1], verb);
		return cli_meta_simple(ctx, &cmd, msg);
	}
	return cli_tenant_main(ctx, argc, argv);
}

static void user_usage(FILE *f)
{
	fprintf(f, "usage: stripedb ctl user create NAME --tenant T --password P\n"
		   "       stripedb ctl user passwd NAME --password P\n"
		   "       stripedb ctl user drop NAME\n"
		   "The password may come from STRIPEDB_PASSWORD instead of --password.\n");
}

int cli_user_cmd(cli_ctx *ctx, int argc, char **argv)
{
	const char *verb = argc > 0 ? argv[0] : NULL, *name = NULL, *tenant = NULL;
	const char *password = getenv("STRIPEDB_PASSWORD");
	bson_t cmd = BSON_INITIALIZER;
	char msg[300];
	int i;

	if (!verb || strcmp(verb, "--help") == 0) {
		user_usage(verb ? stdout : stderr);
		bson_destroy(&cmd);
		return verb ? 0 : 2;
	}
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--tenant") == 0 && i + 1 < argc)
			tenant = argv[++i];
		else if (strncmp(a, "--tenant=", 9) == 0)
			tenant = a + 9;
		else if (strcmp(a, "--password") == 0 && i + 1 < argc)
			password = argv[++i];
		else if (strncmp(a, "--password=", 11) == 0)
			password = a + 11;
		else if (a[0] != '-' && !name)
			name = a;
		else {
			fprintf(stderr, "stripedb ctl user %s: unexpected argument '%s'\n", verb, a);
			bson_destroy(&cmd);
			return 2;
		}
	}
	if (!name || !name[0]) {
		fprintf(stderr, "stripedb ctl user %s: needs a user NAME\n", verb);
		bson_destroy(&cmd);
		return 2;
	}
	if (strcmp(verb, "create") == 0) {
		if (!tenant || !password || !password[0]) {
			fprintf(stderr, "stripedb ctl user create: needs --tenant and --password\n");
			bson_destroy(&cmd);
			return 2;
		}
		BSON_APPEND_UTF8(&cmd, "createUser", name);
		BSON_APPEND_UTF8(&cmd, "tenant", tenant);
		BSON_APPEND_UTF8(&cmd, "password", password);
		snprintf(msg, sizeof msg, "user %s created in tenant %s", name, tenant);
	} else if (strcmp(verb, "passwd") == 0) {
		if (!password || !password[0] || tenant) {
			fprintf(stderr, "stripedb ctl user passwd: needs --password (and no --tenant)\n");
			bson_destroy(&cmd);
			return 2;
		}
		BSON_APPEND_UTF8(&cmd, "updateUser", name);
		BSON_APPEND_UTF8(&cmd, "password", password);
		snprintf(msg, sizeof msg, "user %s: password changed", name);
	} else if (strcmp(verb, "drop") == 0) {
		if (tenant || (password && getenv("STRIPEDB_PASSWORD") != password)) {
			fprintf(stderr, "stripedb ctl user drop: takes only NAME\n");
			bson_destroy(&cmd);
			return 2;
		}
		BSON_APPEND_UTF8(&cmd, "dropUser", name);
		snprintf(msg, sizeof msg, "user %s dropped", name);
	} else {
		fprintf(stderr, "stripedb ctl user: unknown verb '%s'\n", verb);
		user_usage(stderr);
		bson_destroy(&cmd);
		return 2;
	}
	return cli_meta_simple(ctx, &cmd, msg);
}
