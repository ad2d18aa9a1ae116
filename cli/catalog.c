/* `stripedb ctl shard add|remove`, `ctl db create|list`, `ctl collection create|list|drop`
 * (issue #18, DESIGN.md §3a): the cluster catalog, one metadata command each.
 *
 *   shard add ID URI                 {addShard: ID, uri: URI}  (URI: mongodb://..., a
 *                                    replica set as mongodb://h:p,.../?replicaSet=NAME)
 *   shard remove ID                  {removeShard: ID}  (refused while it owns chunks:
 *                                    drain it first with `ctl shard drain`)
 *   db create NAME [--tenant T] [--primary SHARD]
 *                                    {createDatabase: NAME, tenant: T, primary: SHARD}
 *                                    (the shard its unsharded collections live on; without
 *                                    it the lowest shard id; unknown shard: exit 1)
 *   db list                          {listDatabases: 1} (name, tenant, primary shard)
 *   collection create DB.COLL --shard-key F[,F] [--hashed] [--chunks N] [--on SHARD[,SHARD]]
 *                                    {shardCollection: DB.COLL, key, numChunks, shards}
 *                                    (a collection that already holds documents follows
 *                                    MongoDB, as a proxy's shardCollection: every chunk
 *                                    starts on the one shard holding them; on several
 *                                    shards, or --on elsewhere: refused, exit 1)
 *   collection list [DB]             {listCollections: 1, db: DB}
 *   collection drop DB.COLL          {dropCollection: DB.COLL}  (sharding metadata only:
 *                                    the documents stay on the shards)
 * Exit codes: 0 ok, 1 the cluster refused or is unreachable (one line on stderr), 2 usage.
 * Listings also print as JSON lines with --json. */
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/cluster.h"
#include "cli/cli.h"
#include "common/alloc.h"
#include "common/shardref.h"

int cli_catalog_shard(cli_ctx *ctx, int argc, char **argv);
int cli_db_cmd(cli_ctx *ctx, int argc, char **argv);
int cli_collection_cmd(cli_ctx *ctx, int argc, char **argv);

static const char *str_of(const bson_t *d, const char *name)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, d, name) && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return "-";
}

/* Print each document of array `field` of the reply of cmd: as JSON lines with --json,
 * else with line(doc). */
static int listing(cli_ctx *ctx, bson_t *cmd, const char *field, const char *header,
		   void (*line)(const bson_t *))
{
	bson_t reply;
	bson_iter_t arr;
	int rc = cli_meta_run(ctx, cmd, &reply);

	bson_destroy(cmd);
	if (rc == 0) {
		if (!ctx->json)
			printf("%s\n", header);
		if (cli_iter_array(&reply, field, &arr))
			while (bson_iter_next(&arr)) {
				bson_t d;
				if (!sdb_bson_iter_doc(&arr, &d))
					continue;
				if (ctx->json)
					cli_print_json(&d);
				else
					line(&d);
			}
	}
	bson_destroy(&reply);
	return rc;
}

static int usage(const char *what, const char *text)
{
	fprintf(stderr, "stripedb ctl %s: usage: %s\n", what, text);
	return 2;
}

/* ---------- shard add / remove ---------- */

int cli_catalog_shard(cli_ctx *ctx, int argc, char **argv)
{
	bson_t cmd = BSON_INITIALIZER;
	char done[512];

	if (argc == 3 && strcmp(argv[0], "add") == 0 && argv[1][0] != '-' &&
	    strncmp(argv[2], "mongodb://", 10) == 0) {
		bson_error_t e;
		mongoc_uri_t *u = mongoc_uri_new_with_error(argv[2], &e);
		if (u == NULL) {
			bson_destroy(&cmd);
			fprintf(stderr, "stripedb ctl shard add: bad URI: %s\n", e.message);
			return 2;
		}
		mongoc_uri_destroy(u);
		BSON_APPEND_UTF8(&cmd, "addShard", argv[1]);
		BSON_APPEND_UTF8(&cmd, "uri", argv[2]);
		snprintf(done, sizeof done, "shard %s added (%s)", argv[1], argv[2]);
		return cli_meta_simple(ctx, &cmd, done);
	}
	if (argc == 2 && strcmp(argv[0], "remove") == 0 && argv[1][0] != '-') {
		BSON_APPEND_UTF8(&cmd, "removeShard", argv[1]);
		snprintf(done, sizeof done, "shard %s removed", argv[1]);
		return cli_meta_simple(ctx, &cmd, done);
	}
	bson_destroy(&cmd);
	return usage("shard", "shard add ID mongodb://H:P[,H:P...][/?replicaSet=NAME] | shard "
			      "remove ID");
}

/* ---------- db ---------- */

static void db_line(const bson_t *d)
{
	printf("%-30s %-20s %s\n", str_of(d, "name"), str_of(d, "tenant"), str_of(d, "primary"));
}

int cli_db_cmd(cli_ctx *ctx, int argc, char **argv)
{
	static const char *const u = "db create NAME [--tenant T] [--primary SHARD] | db list";
	bson_t cmd = BSON_INITIALIZER;
	const char *verb = argc > 0 ? argv[0] : "";

	if (strcmp(verb, "list") == 0 && argc == 1) {
		BSON_APPEND_INT32(&cmd, "listDatabases", 1);
		return listing(ctx, &cmd, "databases",
			       "DATABASE                       TENANT               PRIMARY", db_line);
	}
	if (strcmp(verb, "create") == 0 && argc >= 2 && argv[1][0] != '-') {
		const char *tenant = NULL, *primary = NULL;
		char done[300];
		for (int i = 2; i < argc; i++) {
			if (strcmp(argv[i], "--tenant") == 0 && i + 1 < argc)
				tenant = argv[++i];
			else if (strncmp(argv[i], "--tenant=", 9) == 0)
				tenant = argv[i] + 9;
			else if (strcmp(argv[i], "--primary") == 0 && i + 1 < argc &&
				 argv[i + 1][0] != '\0' && argv[i + 1][0] != '-')
				primary = argv[++i];
			else if (strncmp(argv[i], "--primary=", 10) == 0 && argv[i][10] != '\0')
				primary = argv[i] + 10;
			else {
				bson_destroy(&cmd);
				return usage("db", u);
			}
		}
		if (strpbrk(argv[1], "/\\. \"$") != NULL) {
			bson_destroy(&cmd);
			fprintf(stderr, "stripedb ctl db: invalid database name '%s'\n", argv[1]);
			return 2;
		}
		BSON_APPEND_UTF8(&cmd, "createDatabase", argv[1]);
		if (tenant)
			BSON_APPEND_UTF8(&cmd, "tenant", tenant);
		if (primary)
			BSON_APPEND_UTF8(&cmd, "primary", primary);
		if (primary)
			snprintf(done, sizeof done, "database %s created (primary shard %s)", argv[1],
				 primary);
		else
			snprintf(done, sizeof done, "database %s created", argv[1]);
		return cli_meta_simple(ctx, &cmd, done);
	}
	bson_destroy(&cmd);
	return usage("db", u);
}

/* ---------- collection ---------- */

static void coll_line(const bson_t *d)
{
	bson_iter_t it;
	char *k = NULL;

	if (bson_iter_init_find(&it, d, "key") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		bson_t key;
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&it, &len, &data);
		if (bson_init_static(&key, data, len))
			k = bson_as_relaxed_extended_json(&key, NULL);
	}
	printf("%-40s %-30s %s\n", str_of(d, "ns"), k ? k : "-",
	       bson_iter_init_find(&it, d, "hashed") && bson_iter_as_bool(&it) ? "hashed"
									   : "ranged");
	bson_free(k);
}

/* Append the comma-separated list s as an array (or a document of fields, value v/hv). */
static bool append_fields(bson_t *doc, const char *s, bool hashed)
{
	char *copy = sdb_strdup(s), *save = NULL, *tok;
	bool ok = true;
	int n = 0;

	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save), n++) {
		if (tok[0] == '\0' || tok[0] == '$') {
			ok = false;
			break;
		}
		if (hashed)
			BSON_APPEND_UTF8(doc, tok, "hashed");
		else
			BSON_APPEND_INT32(doc, tok, 1);
	}
	free(copy);
	return ok && n > 0 && !(hashed && n > 1);
}

static bool append_list(bson_t *doc, const char *name, const char *s)
{
	char *copy = sdb_strdup(s), *save = NULL, *tok, k[16];
	bson_t arr;
	unsigned n = 0;

	BSON_APPEND_ARRAY_BEGIN(doc, name, &arr);
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		snprintf(k, sizeof k, "%u", n++);
		BSON_APPEND_UTF8(&arr, k, tok);
	}
	bson_append_array_end(doc, &arr);
	free(copy);
	return n > 0;
}

static bool valid_ns(const char *ns)
{
	const char *dot = strchr(ns, '.');
	return ns[0] != '-' && dot && dot != ns && dot[1] != '\0';
}

/* The shard that holds documents of ns, asked on every registered shard (a count with
 * limit 1, over the cluster's credentials): into holder (empty when none). Returns 0, 1
 * after printing one line (several shards hold documents, a shard cannot be asked). */
static int data_holder(cli_ctx *ctx, const char *ns, char *holder, size_t len)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	sdb_shard_ref *shards = NULL;
	size_t n = 0, i;
	const char *dot = strchr(ns, '.');
	char db[256];
	int rc = 0;

	holder[0] = '\0';
	snprintf(db, sizeof db, "%.*s", (int)(dot - ns), ns);
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (cli_meta_run(ctx, &cmd, &reply) != 0) {
		bson_destroy(&cmd);
		return 1;
	}
	sdb_shard_refs_parse(&reply, &shards, &n);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	for (i = 0; i < n && rc == 0; i++) {
		char *u = strstr(shards[i].uri, "://")
				  ? sdb_asprintf("%s", shards[i].uri)
				  : sdb_asprintf("mongodb://%s/?directConnection=true", shards[i].uri);
		mongoc_client_t *c = auth_cluster_client_new(u);
		bson_t q = BSON_INITIALIZER, r;
		bson_error_t e;
		free(u);
		if (c == NULL) {
			fprintf(stderr, "stripedb ctl collection: bad URI of shard %s\n", shards[i].id);
			rc = 1;
			break;
		}
		BSON_APPEND_UTF8(&q, "count", dot + 1);
		BSON_APPEND_INT32(&q, "limit", 1);
		if (!mongoc_client_command_simple(c, db, &q, NULL, &r, &e)) {
			fprintf(stderr, "stripedb ctl collection: cannot ask shard %s whether %s holds "
					"documents: %s\n", shards[i].id, ns, e.message);
			rc = 1;
		} else {
			bson_iter_t it;
			if (bson_iter_init_find(&it, &r, "n") && bson_iter_as_int64(&it) > 0) {
				if (holder[0]) {
					fprintf(stderr, "stripedb ctl collection: %s holds documents on "
							"shards %s and %s: refused (shard a collection "
							"whose documents are on one shard)\n",
						ns, holder, shards[i].id);
					rc = 1;
				}
				snprintf(holder, len, "%s", shards[i].id);
			}
		}
		bson_destroy(&r);
		bson_destroy(&q);
		mongoc_client_destroy(c);
	}
	sdb_shard_refs_free(shards, n);
	return rc;
}

int cli_collection_cmd(cli_ctx *ctx, int argc, char **argv)
{
	static const char *const u =
		"collection create DB.COLL --shard-key F[,F] [--hashed] [--chunks N] "
		"[--on SHARD[,SHARD]] | collection list [DB] | collection drop DB.COLL";
	bson_t cmd = BSON_INITIALIZER;
	const char *verb = argc > 0 ? argv[0] : "";
	char done[600];

	if (strcmp(verb, "list") == 0 && argc <= 2) {
		BSON_APPEND_INT32(&cmd, "listCollections", 1);
		if (argc == 2)
			BSON_APPEND_UTF8(&cmd, "db", argv[1]);
		return listing(ctx, &cmd, "collections",
			       "NAMESPACE                                KEY                            KIND",
			       coll_line);
	}
	if (strcmp(verb, "drop") == 0 && argc == 2 && valid_ns(argv[1])) {
		BSON_APPEND_UTF8(&cmd, "dropCollection", argv[1]);
		snprintf(done, sizeof done, "collection %s dropped (its sharding metadata)",
			 argv[1]);
		return cli_meta_simple(ctx, &cmd, done);
	}
	if (strcmp(verb, "create") == 0 && argc >= 2 && valid_ns(argv[1])) {
		const char *key = NULL, *on = NULL;
		bool hashed = false;
		long long chunks = 0;
		bson_t kd;
		for (int i = 2; i < argc; i++) {
			const char *a = argv[i];
			if (strcmp(a, "--shard-key") == 0 && i + 1 < argc)
				key = argv[++i];
			else if (strncmp(a, "--shard-key=", 12) == 0)
				key = a + 12;
			else if (strcmp(a, "--hashed") == 0)
				hashed = true;
			else if ((strcmp(a, "--chunks") == 0 && i + 1 < argc) ||
				 strncmp(a, "--chunks=", 9) == 0) {
				const char *v = a[8] == '=' ? a + 9 : argv[++i];
				char *end;
				chunks = strtoll(v, &end, 10);
				if (*end != '\0' || chunks <= 0) {
					bson_destroy(&cmd);
					fprintf(stderr, "stripedb ctl collection: --chunks: '%s' is not "
							"a positive integer\n", v);
					return 2;
				}
			} else if (strcmp(a, "--on") == 0 && i + 1 < argc)
				on = argv[++i];
			else if (strncmp(a, "--on=", 5) == 0)
				on = a + 5;
			else {
				bson_destroy(&cmd);
				return usage("collection", u);
			}
		}
		if (key == NULL || (chunks > 0 && !hashed)) {
			bson_destroy(&cmd);
			fprintf(stderr, "stripedb ctl collection: %s\n",
				key == NULL ? "--shard-key is required"
					    : "--chunks needs --hashed (ranged keys start with one chunk)");
			return 2;
		}
		BSON_APPEND_UTF8(&cmd, "shardCollection", argv[1]);
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "key", &kd);
		if (!append_fields(&kd, key, hashed)) {
			bson_append_document_end(&cmd, &kd);
			bson_destroy(&cmd);
			fprintf(stderr, "stripedb ctl collection: bad --shard-key '%s'%s\n", key,
				hashed ? " (a hashed key has one field)" : "");
			return 2;
		}
		bson_append_document_end(&cmd, &kd);
		if (chunks > 0)
			BSON_APPEND_INT64(&cmd, "numChunks", chunks);
		{
			/* documents already there stay where they are: every chunk on their shard */
			char holder[128];
			if (data_holder(ctx, argv[1], holder, sizeof holder) != 0) {
				bson_destroy(&cmd);
				return 1;
			}
			if (holder[0] && on && strcmp(on, holder) != 0) {
				bson_destroy(&cmd);
				fprintf(stderr, "stripedb ctl collection: %s already holds documents on "
						"shard %s: its chunks must start there (--on %s)\n",
					argv[1], holder, holder);
				return 1;
			}
			if (holder[0])
				on = NULL;
			if (holder[0] && !append_list(&cmd, "shards", holder)) {
				bson_destroy(&cmd);
				return usage("collection", u);
			}
		}
		if (on && !append_list(&cmd, "shards", on)) {
			bson_destroy(&cmd);
			return usage("collection", u);
		}
		snprintf(done, sizeof done, "collection %s sharded", argv[1]);
		return cli_meta_simple(ctx, &cmd, done);
	}
	bson_destroy(&cmd);
	return usage("collection", u);
}
