/* `stripedb ctl` subcommands of the Data Movement Platform (issue #8, DESIGN.md §3a, §6):
 *
 *   migrate DB.COLL --chunk ID --to SHARD [--wait] [--dry-run] [--max-pause-ms=N]
 *           [--grace-ms=N] [--import-order=index|arrival|id] [--id=ID]
 *       register a migration of one chunk (the coordinators run it); --dry-run prints the
 *       plan; --wait follows it to a terminal state (exit 0 on complete, 1 otherwise).
 *   migrate DB.COLL --chunks A,B,C --to SHARD [options as above]
 *   migrate DB.COLL --filter JSON --to SHARD [options as above]
 *   migrate --plan FILE|- [options as above]
 *       several chunks at once (cli/migrate_plan.c, which describes the plan document and
 *       which import filters are accepted): the whole plan is checked first (exit 2, one
 *       line on stderr, nothing registered), a filter's key range is cut out of its chunks
 *       (splitChunk), every migration's spec carries the plan's "group"; a failed
 *       registration aborts the earlier ones (exit 1).
 *   migration list [--group PLAN] [--json]  every migration (or one plan's): id, ns, chunk,
 *                                 from -> to, state, group
 *   migration status ID [--json]  state, per-phase counts, lag, switch pauses
 *   migration rollback ID         before the switch: abort; after it (switched): traffic
 *                                 back to the source (the coordinator runs rolling_back)
 *   migration pause ID            pause replication (takes the lease mig-pause/ID for 24 h)
 *   migration resume ID           resume it (releases that lease)
 *   shard drain SHARD [--to SHARD] [--wait] [--dry-run]   move every chunk off SHARD
 *   shard split SHARD --to NEW [--wait] [--dry-run]        move half of SHARD's chunks
 *   rebalance --bin-pack [--wait] [--dry-run]   drain the shard with the fewest chunks into
 *                                 the next coldest one (chunk count stands for heat)
 *   tenant isolate TENANT --to SHARD [--wait] [--dry-run]  move every chunk of the
 *                                 tenant's databases to SHARD
 *   chunk list DB.COLL | chunk split DB.COLL --at JSON_KEY | chunk merge DB.COLL --chunks A,B
 *
 * Talks only to metadata (registerMigration, updateMigration with expectState,
 * getMigration, listMigrations, getRoutingTable, splitChunk). Exit codes: 0 ok, 1 cluster
 * error or a migration that ended other than complete, 2 bad usage.
 */
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/migrate_int.h"
#include "cli/shardset.h"
#include "auth/cluster.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "routing/route.h"
#include "raft/migstate.h"


int cli_migrate_main(struct cli_ctx *ctx, int argc, char **argv);
int cli_migration_main(struct cli_ctx *ctx, int argc, char **argv);
int cli_shard_main(struct cli_ctx *ctx, int argc, char **argv);
int cli_catalog_shard(struct cli_ctx *ctx, int argc, char **argv); /* cli/catalog.c */
int cli_chunk_main(struct cli_ctx *ctx, int argc, char **argv);
int cli_rebalance_main(struct cli_ctx *ctx, int argc, char **argv);
int cli_tenant_main(struct cli_ctx *ctx, int argc, char **argv);

int cmig_run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply)
{
	bson_error_t e;
	if (mongoc_client_command_simple(c, "admin", cmd, NULL, reply, &e))
		return 0;
	/* libmongoc fills reply on failure too: callers only keep it on success */
	bson_destroy(reply);
	bson_init(reply);
	fprintf(stderr, "stripedb ctl: %s\n", e.message);
	return e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
}

const char *cmig_sval(const bson_t *d, const char *k, char *buf, size_t n)
{
	bson_iter_t it;
	buf[0] = '\0';
	if (bson_iter_init_find(&it, d, k)) {
		if (BSON_ITER_HOLDS_UTF8(&it))
			snprintf(buf, n, "%s", bson_iter_utf8(&it, NULL));
		else if (BSON_ITER_HOLDS_NUMBER(&it))
			snprintf(buf, n, "%" PRId64, bson_iter_as_int64(&it));
	}
	return buf;
}

int64_t cmig_ival(const bson_t *d, const char *k)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it)
									      : 0;
}

bool cmig_sub(const bson_t *d, const char *k, bson_t *out)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;
	if (!bson_iter_init_find(&it, d, k) ||
	    !(BSON_ITER_HOLDS_DOCUMENT(&it) || BSON_ITER_HOLDS_ARRAY(&it)))
		return false;
	if (BSON_ITER_HOLDS_DOCUMENT(&it))
		bson_iter_document(&it, &len, &data);
	else
		bson_iter_array(&it, &len, &data);
	return bson_init_static(out, data, len);
}

/* The chunks of ns (or "all"): the getRoutingTable reply, its cursor followed (issue #26:
 * a table of any size comes in batches of at most 8 MB): {routingVersion, key, hashed,
 * chunks: [every chunk]} (caller destroys). Returns 0 or cmig_run()'s error. */
int cmig_routing(mongoc_client_t *c, const char *ns, bson_t *reply)
{
	bson_t resume = BSON_INITIALIZER, arr;
	bool more = true, first = true;
	uint32_t n = 0;
	int rc = 0;

	bson_init(reply);
	while (more) {
		bson_t cmd = BSON_INITIALIZER, cur, batch, chunks;
		bson_iter_t it;
		BSON_APPEND_UTF8(&cmd, "getRoutingTable", ns);
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "cursor", &cur);
		bson_append_document_end(&cmd, &cur);
		if (!first)
			BSON_APPEND_DOCUMENT(&cmd, "resumeAfter", &resume);
		rc = cmig_run(c, &cmd, &batch);
		bson_destroy(&cmd);
		if (rc != 0) {
			bson_destroy(&batch);
			break;
		}
		if (first) {
			/* the header fields of the first batch; its version is the table's */
			if (bson_iter_init(&it, &batch))
				while (bson_iter_next(&it)) {
					const char *k = bson_iter_key(&it);
					if (strcmp(k, "routingVersion") == 0 || strcmp(k, "key") == 0 ||
					    strcmp(k, "hashed") == 0)
						bson_append_iter(reply, k, -1, &it);
				}
			bson_append_array_begin(reply, "chunks", -1, &arr);
			first = false;
		}
		if (cmig_sub(&batch, "chunks", &chunks) && bson_iter_init(&it, &chunks))
			while (bson_iter_next(&it)) {
				const char *key;
				char buf[16];
				bson_uint32_to_string(n++, &key, buf, sizeof buf);
				bson_append_iter(&arr, key, -1, &it);
			}
		more = bson_iter_init_find(&it, &batch, "more") && bson_iter_as_bool(&it) &&
		       cmig_sub(&batch, "resumeAfter", &chunks);
		if (more) {
			bson_reinit(&resume);
			bson_concat(&resume, &chunks);
		}
		bson_destroy(&batch);
	}
	if (!first)
		bson_append_array_end(reply, &arr);
	bson_destroy(&resume);
	if (rc != 0) { /* callers keep the reply on success only */
		bson_destroy(reply);
		bson_init(reply);
	}
	return rc;
}

/* registerMigration; id into idbuf. */
int cmig_register(mongoc_client_t *c, const char *ns, int64_t chunk, const char *from,
			const char *to, const mig_opts *o, char *idbuf, size_t idlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	if (o->id)
		snprintf(idbuf, idlen, "%s", o->id);
	else
		snprintf(idbuf, idlen, "mig-%" PRId64 "-%" PRIx64 "%04x", chunk,
			 sdb_wall_ms(), (unsigned)(getpid() & 0xffff));
	BSON_APPEND_UTF8(&cmd, "registerMigration", idbuf);
	BSON_APPEND_UTF8(&cmd, "ns", ns);
	BSON_APPEND_INT64(&cmd, "chunk", chunk);
	BSON_APPEND_UTF8(&cmd, "from", from);
	BSON_APPEND_UTF8(&cmd, "to", to);
	if (o->max_pause_ms > 0)
		BSON_APPEND_INT64(&cmd, "maxPauseMS", o->max_pause_ms);
	if (o->grace_ms >= 0)
		BSON_APPEND_INT64(&cmd, "graceMS", o->grace_ms);
	if (o->order)
		BSON_APPEND_UTF8(&cmd, "importOrder", o->order);
	if (o->group) /* metadata stores the spec as given; the coordinator ignores it */
		BSON_APPEND_UTF8(&cmd, "group", o->group);
	int rc = cmig_run(c, &cmd, &reply);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

static int get_mig(mongoc_client_t *c, const char *id, bson_t *out)
{
	bson_t cmd = BSON_INITIALIZER, reply, m;
	BSON_APPEND_UTF8(&cmd, "getMigration", id);
	int rc = cmig_run(c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc == 0 && cmig_sub(&reply, "migration", &m))
		bson_copy_to(&m, out);
	else if (rc == 0)
		rc = -1;
	bson_destroy(&reply);
	return rc;
}

/* Print migration document m: JSON with ctx->json, else state, per-phase counts, lag and
 * switch pauses, one field a line. */
static void print_status(struct cli_ctx *ctx, const bson_t *m)
{
	char id[128], st[32], ns[256], from[64], to[64], chunk[32];
	bson_t spec, stats, v, p;
	if (ctx->json) {
		cli_print_json(m);
		return;
	}
	cmig_sval(m, "id", id, sizeof id);
	cmig_sval(m, "state", st, sizeof st);
	cmig_sval(m, "ns", ns, sizeof ns);
	from[0] = to[0] = chunk[0] = '\0';
	if (cmig_sub(m, "spec", &spec)) {
		cmig_sval(&spec, "from", from, sizeof from);
		cmig_sval(&spec, "to", to, sizeof to);
		cmig_sval(&spec, "chunk", chunk, sizeof chunk);
	}
	printf("%s  %s chunk %s  %s -> %s  state %s\n", id, ns, chunk, from, to, st);
	if (cmig_sub(m, "stats", &stats)) {
		int64_t ims = cmig_ival(&stats, "importMS");
		printf("  import     %" PRId64 " docs, %" PRId64 " bytes in %" PRId64 " ms (%" PRId64
		       " docs/s)\n",
		       cmig_ival(&stats, "imported"), cmig_ival(&stats, "importBytes"), ims,
		       ims > 0 ? cmig_ival(&stats, "imported") * 1000 / ims : 0);
		bson_iter_t pit;
		bool is_paused = bson_iter_init_find(&pit, &stats, "paused") && bson_iter_as_bool(&pit);
		printf("  replicate  %" PRId64 " applied, %" PRId64 " skipped, lag %" PRId64 " ms%s\n",
		       cmig_ival(&stats, "applied"), cmig_ival(&stats, "skipped"), cmig_ival(&stats, "lagMS"),
		       is_paused ? " (paused)" : "");
		if (cmig_sub(&stats, "verify", &v))
			printf("  verify     %" PRId64 " docs, %" PRId64 " missing, %" PRId64
			       " extra, %" PRId64 " different\n",
			       cmig_ival(&v, "count"), cmig_ival(&v, "missing"), cmig_ival(&v, "extra"),
			       cmig_ival(&v, "different"));
		printf("  switch     pause %" PRId64 " ms, %" PRId64 " attempts", cmig_ival(&stats, "pauseMS"),
		       cmig_ival(&stats, "switchAttempts"));
		if (cmig_sub(&stats, "pausesMS", &p)) {
			bson_iter_t it;
			printf(" (all:");
			bson_iter_init(&it, &p);
			while (bson_iter_next(&it))
				printf(" %" PRId64, bson_iter_as_int64(&it));
			printf(")");
		}
		printf("\n  reverse    %" PRId64 " applied; cleanup deleted %" PRId64 "\n",
		       cmig_ival(&stats, "reverseApplied"), cmig_ival(&stats, "deleted"));
		char e[512];
		if (cmig_sval(&stats, "error", e, sizeof e)[0])
			printf("  error      %s\n", e);
	}
}

/* Poll until every id is terminal. Returns 0 when all completed, 1 otherwise. */
int cmig_wait_all(struct cli_ctx *ctx, mongoc_client_t *c, char ids[][128], size_t n)
{
	int tty = isatty(1) && !ctx->json;
	int failed = 0;
	for (size_t i = 0; i < n; i++) {
		char st[32] = "";
		for (;;) {
			bson_t m;
			if (get_mig(c, ids[i], &m) != 0) {
				usleep(200000);
				continue;
			}
			cmig_sval(&m, "state", st, sizeof st);
			mig_state s = migrate_state_parse(st);
			if (tty) {
				int k = s == MIG_UNKNOWN ? 0 : s > MIG_COMPLETE ? 7 : (int)s;
				printf("\r%s [%.*s%*s] %-12s", ids[i], k * 3, "#####################",
				       (7 - k) * 3, "", st);
				fflush(stdout);
			}
			if (migrate_state_terminal(s)) {
				if (tty)
					printf("\n");
				if (s != MIG_COMPLETE) {
					failed = 1;
					print_status(ctx, &m);
				} else if (!tty && !ctx->json) {
					printf("%s complete\n", ids[i]);
				}
				bson_destroy(&m);
				break;
			}
			bson_destroy(&m);
			usleep(100000);
		}
	}
	return failed;
}

/* Whether an --import-order value is one the coordinator knows (NULL: not given). */
static bool order_ok(const char *order)
{
	return !order || strcmp(order, "index") == 0 || strcmp(order, "arrival") == 0 ||
	       strcmp(order, "id") == 0;
}

static int parse_common(const char *a, mig_opts *o)
{
	if (strcmp(a, "--wait") == 0)
		o->wait = 1;
	else if (strcmp(a, "--dry-run") == 0)
		o->dry_run = 1;
	else if (strncmp(a, "--max-pause-ms=", 15) == 0)
		o->max_pause_ms = atoll(a + 15);
	else if (strncmp(a, "--grace-ms=", 11) == 0)
		o->grace_ms = atoll(a + 11);
	else if (strncmp(a, "--import-order=", 15) == 0)
		o->order = a + 15;
	else if (strncmp(a, "--id=", 5) == 0)
		o->id = a + 5;
	else
		return 0;
	return 1;
}

/* The one argument parser of the subcommands in this file: argv[first..argc) of
 * `stripedb ctl CMD`, matched against opts (may be NULL), then parse_common's options when
 * o is set, then, when pos is set, the first word not starting with '-' goes to *pos.
 * "NAME" as the last word (no value) is not an option. Returns 0, or 2 (the exit code of
 * bad usage) after printing "stripedb ctl CMD: unexpected argument 'A'" for the first
 * argument that matched nothing; the outputs may then be partly set. */
int cmig_parse_args(const char *cmd, int argc, char **argv, int first, const arg_opt *opts,
		      mig_opts *o, const char **pos)
{
	for (int i = first; i < argc; i++) {
		const char *a = argv[i];
		const arg_opt *m = NULL;
		size_t nl = 0;
		for (const arg_opt *t = opts; t && t->name && !m; t++) {
			nl = strlen(t->name);
			if (strcmp(a, t->name) == 0 && (t->flag || i + 1 < argc))
				m = t;
			else if (t->val && strncmp(a, t->name, nl) == 0 && a[nl] == '=')
				m = t;
		}
		if (m && m->flag)
			*m->flag = 1;
		else if (m)
			*m->val = a[nl] == '=' ? a + nl + 1 : argv[++i];
		else if (o && parse_common(a, o))
			continue;
		else if (pos && a[0] != '-' && !*pos)
			*pos = a;
		else {
			fprintf(stderr, "stripedb ctl %s: unexpected argument '%s'\n", cmd, a);
			return 2;
		}
	}
	return 0;
}

/* `ctl migrate` (argv after "migrate"; the file comment has the usage). Returns: the exit
 * code, 0, 1 (cluster error, or --wait saw an end other than complete), 2 usage. */
int cli_migrate_main(struct cli_ctx *ctx, int argc, char **argv)
{
	const char *ns = NULL, *to = NULL, *chunk_s = NULL, *plan = NULL, *chunks_s = NULL,
		   *filter = NULL;
	mig_opts o = {.grace_ms = -1};
	const arg_opt opts[] = {{"--chunk", &chunk_s, NULL}, {"--to", &to, NULL},
				{"--plan", &plan, NULL},     {"--chunks", &chunks_s, NULL},
				{"--filter", &filter, NULL}, {0}};
	if (cmig_parse_args("migrate", argc, argv, 0, opts, &o, &ns) != 0)
		return 2;
	if (plan || chunks_s || filter) {
		if (chunk_s || (!!plan + !!chunks_s + !!filter) != 1 || (plan && (ns || to)) ||
		    (!plan && (!ns || !strchr(ns, '.') || !to)) || o.id ||
		    !order_ok(o.order)) {
			fprintf(stderr, "stripedb ctl migrate: usage: migrate --plan FILE|- | migrate "
					"DB.COLL --chunks A,B,C --to SHARD | migrate DB.COLL --filter "
					"JSON --to SHARD [--wait] [--dry-run] [--max-pause-ms=N] "
					"[--grace-ms=N] [--import-order=index|arrival|id]\n");
			return 2;
		}
		return cli_migrate_plan(ctx, ns, to, plan, chunks_s, filter, &o);
	}
	int64_t chunk = chunk_s ? atoll(chunk_s) : 0;
	if (!ns || !strchr(ns, '.') || chunk <= 0 || !to ||
	    !order_ok(o.order)) {
		fprintf(stderr, "stripedb ctl migrate: usage: migrate DB.COLL --chunk ID --to SHARD "
				"[--wait] [--dry-run] [--max-pause-ms=N] [--grace-ms=N] "
				"[--import-order=index|arrival|id]\n");
		return 2;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	if (!c)
		return 2;
	bson_t rt;
	int rc = 1;
	if (cmig_routing(c, ns, &rt) != 0)
		goto out_client;
	bson_t chunks;
	bson_iter_t it;
	char from[64] = "";
	if (cmig_sub(&rt, "chunks", &chunks) && bson_iter_init(&it, &chunks))
		while (bson_iter_next(&it)) {
			bson_t ch;
			if (!sdb_bson_iter_doc(&it, &ch))
				continue;
			if (cmig_ival(&ch, "id") == chunk)
				cmig_sval(&ch, "shard", from, sizeof from);
		}
	if (!from[0]) {
		fprintf(stderr, "stripedb ctl migrate: no chunk %" PRId64 " in %s\n", chunk, ns);
		goto out;
	}
	if (strcmp(from, to) == 0) {
		fprintf(stderr, "stripedb ctl migrate: chunk %" PRId64 " is already on %s\n", chunk, to);
		goto out;
	}
	if (o.dry_run) {
		if (ctx->json)
			printf("{\"plan\": [{\"ns\": \"%s\", \"chunk\": %" PRId64
			       ", \"from\": \"%s\", \"to\": \"%s\"}]}\n",
			       ns, chunk, from, to);
		else
			printf("would migrate %s chunk %" PRId64 " from %s to %s\n", ns, chunk, from, to);
		rc = 0;
		goto out;
	}
	char ids[1][128];
	if (cmig_register(c, ns, chunk, from, to, &o, ids[0], sizeof ids[0]) != 0)
		goto out;
	if (ctx->json)
		printf("{\"id\": \"%s\"}\n", ids[0]);
	else
		printf("%s\n", ids[0]);
	fflush(stdout);
	rc = o.wait ? cmig_wait_all(ctx, c, ids, 1) : 0;
out:
	bson_destroy(&rt);
out_client:
	mongoc_client_destroy(c);
	return rc;
}

/* Is migration document m of plan group (its spec's "group"; NULL: every migration)? */
static bool in_group(const bson_t *m, const char *group)
{
	bson_t spec;
	char g[128] = "";
	if (!group)
		return true;
	if (cmig_sub(m, "spec", &spec))
		cmig_sval(&spec, "group", g, sizeof g);
	return strcmp(g, group) == 0;
}

/* `ctl migration list [--group G]`: every migration (listMigrations), or those of one plan
 * (spec.group), as a table (GROUP last, "-" for none) or JSON. Returns: the exit code, 0
 * or 1 after the error line. */
static int migration_list(struct cli_ctx *ctx, mongoc_client_t *c, const char *group)
{
	bson_t cmd = BSON_INITIALIZER, reply, arr;
	bson_iter_t it;
	BSON_APPEND_INT32(&cmd, "listMigrations", 1);
	int rc = cmig_run(c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc != 0) {
		bson_destroy(&reply);
		return 1;
	}
	if (ctx->json) {
		bson_t out = BSON_INITIALIZER, oarr;
		uint32_t k = 0;
		BSON_APPEND_ARRAY_BEGIN(&out, "migrations", &oarr);
		if (cmig_sub(&reply, "migrations", &arr) && bson_iter_init(&it, &arr))
			while (bson_iter_next(&it)) {
				bson_t m;
				const char *key;
				char kb[16];
				if (!sdb_bson_iter_doc(&it, &m) || !in_group(&m, group))
					continue;
				bson_uint32_to_string(k++, &key, kb, sizeof kb);
				bson_append_document(&oarr, key, -1, &m);
			}
		bson_append_array_end(&out, &oarr);
		cli_print_json(&out);
		bson_destroy(&out);
	} else if (cmig_sub(&reply, "migrations", &arr) && bson_iter_init(&it, &arr)) {
		printf("%-32s %-20s %-8s %-10s %-10s %-12s %s\n", "ID", "NS", "CHUNK", "FROM", "TO",
		       "STATE", "GROUP");
		while (bson_iter_next(&it)) {
			bson_t m, spec;
			char id[128], ns[256], st[32], from[64] = "", to[64] = "", ch[32] = "",
									  g[128] = "";
			if (!sdb_bson_iter_doc(&it, &m) || !in_group(&m, group))
				continue;
			if (cmig_sub(&m, "spec", &spec)) {
				cmig_sval(&spec, "from", from, sizeof from);
				cmig_sval(&spec, "to", to, sizeof to);
				cmig_sval(&spec, "chunk", ch, sizeof ch);
				cmig_sval(&spec, "group", g, sizeof g);
			}
			printf("%-32s %-20s %-8s %-10s %-10s %-12s %s\n",
			       cmig_sval(&m, "id", id, sizeof id), cmig_sval(&m, "ns", ns, sizeof ns), ch,
			       from, to, cmig_sval(&m, "state", st, sizeof st), g[0] ? g : "-");
		}
	}
	bson_destroy(&reply);
	return 0;
}

int cmig_rollback(mongoc_client_t *c, const char *id)
{
	for (int tries = 0; tries < 50; tries++) {
		bson_t m;
		char st[32];
		if (get_mig(c, id, &m) != 0)
			return 1;
		cmig_sval(&m, "state", st, sizeof st);
		bson_destroy(&m);
		mig_state s = migrate_state_parse(st);
		mig_state to;
		/* the edges come from the one table (raft/migstate.h) */
		if (s == MIG_SWITCHING) {
			sdb_sleep_ms(100); /* transient: wait for its outcome */
			continue;
		} else if (migrate_transition_ok(s, MIG_ROLLING_BACK)) {
			to = MIG_ROLLING_BACK;
		} else if (migrate_transition_ok(s, MIG_ABORTED)) {
			to = MIG_ABORTED;
		} else {
			fprintf(stderr, "stripedb ctl migration rollback: %s is %s: nothing to roll back\n",
				id, st);
			return 1;
		}
		bson_t cmd = BSON_INITIALIZER, reply;
		BSON_APPEND_UTF8(&cmd, "updateMigration", id);
		BSON_APPEND_UTF8(&cmd, "expectState", st);
		BSON_APPEND_UTF8(&cmd, "state", migrate_state_name(to));
		bson_error_t e;
		bool ok = mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e);
		bson_destroy(&cmd);
		bson_destroy(&reply);
		if (ok) {
			printf("%s: %s -> %s\n", id, st, migrate_state_name(to));
			return 0;
		}
		if (!(e.domain == MONGOC_ERROR_SERVER && e.code == 112)) {
			fprintf(stderr, "stripedb ctl: %s\n", e.message);
			return 1;
		}
	}
	fprintf(stderr, "stripedb ctl migration rollback: %s keeps changing state\n", id);
	return 1;
}

static int migration_pause(mongoc_client_t *c, const char *id, bool pause)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	char name[200];
	snprintf(name, sizeof name, "mig-pause/%s", id);
	BSON_APPEND_UTF8(&cmd, pause ? "acquireLease" : "releaseLease", name);
	BSON_APPEND_UTF8(&cmd, "holder", "stripedb-ctl");
	if (pause)
		BSON_APPEND_INT64(&cmd, "ttlMS", 86400000);
	int rc = cmig_run(c, &cmd, &reply);
	bson_destroy(&cmd);
	bson_destroy(&reply);
	if (rc == 0)
		printf("%s: replication %s\n", id, pause ? "paused" : "resumed");
	return rc == 0 ? 0 : 1;
}

/* `ctl migration list|status|rollback|pause|resume` (argv from the verb). Returns: the
 * exit code, 0, 1 cluster error, 2 usage. */
int cli_migration_main(struct cli_ctx *ctx, int argc, char **argv)
{
	int json = ctx->json;
	const char *verb = argc > 0 ? argv[0] : NULL, *id = NULL, *group = NULL;
	const arg_opt opts[] = {{"--json", NULL, &json}, {"--group", &group, NULL}, {0}};
	if (cmig_parse_args("migration", argc, argv, 1, opts, NULL, &id) != 0)
		return 2;
	ctx->json = json;
	if (!verb || (strcmp(verb, "list") != 0 && !id) ||
	    (strcmp(verb, "list") && strcmp(verb, "status") && strcmp(verb, "rollback") &&
	     strcmp(verb, "pause") && strcmp(verb, "resume"))) {
		fprintf(stderr, "stripedb ctl migration: usage: migration list [--group G] | status ID | rollback ID "
				"| pause ID | resume ID [--json]\n");
		return 2;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	if (!c)
		return 2;
	int rc;
	if (strcmp(verb, "list") == 0) {
		rc = migration_list(ctx, c, group);
	} else if (strcmp(verb, "status") == 0) {
		bson_t m;
		rc = get_mig(c, id, &m) == 0 ? 0 : 1;
		if (rc == 0) {
			print_status(ctx, &m);
			bson_destroy(&m);
		}
	} else if (strcmp(verb, "pause") == 0 || strcmp(verb, "resume") == 0) {
		rc = migration_pause(c, id, strcmp(verb, "pause") == 0);
	} else {
		rc = cmig_rollback(c, id);
	}
	mongoc_client_destroy(c);
	return rc;
}

/* Is shard id marked draining in metadata (listShards state "draining", set by a proxy's
 * removeShard at cluster op version 3)? False when it is not or cannot be read. */
static bool is_draining(mongoc_client_t *c, const char *id)
{
	bson_t cmd = BSON_INITIALIZER, reply, arr;
	bson_iter_t it;
	bool draining = false;
	bson_error_t e;

	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e) &&
	    cmig_sub(&reply, "shards", &arr) && bson_iter_init(&it, &arr))
		while (bson_iter_next(&it)) {
			bson_t s;
			char sid[64], st[32];
			if (!sdb_bson_iter_doc(&it, &s))
				continue;
			if (strcmp(cmig_sval(&s, "id", sid, sizeof sid), id) == 0 &&
			    strcmp(cmig_sval(&s, "state", st, sizeof st), "draining") == 0)
				draining = true;
		}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return draining;
}

/* shard drain / split: one migration per chunk, spread over the routing table (argv
 * from the verb; list and member go to cli/shardset.c, add and remove to cli/catalog.c).
 * Returns: the exit code, 0, 1 cluster error or a migration that failed, 2 usage. */
int cli_shard_main(struct cli_ctx *ctx, int argc, char **argv)
{
	const char *verb = argc > 0 ? argv[0] : NULL, *shard = NULL, *to = NULL;
	mig_opts o = {.grace_ms = -1};
	if (verb && (strcmp(verb, "list") == 0 || strcmp(verb, "member") == 0))
		return cli_shardset_main(ctx, argc, argv); /* cli/shardset.c: replica sets */
	if (verb && (strcmp(verb, "add") == 0 || strcmp(verb, "remove") == 0))
		return cli_catalog_shard(ctx, argc, argv); /* cli/catalog.c */
	const arg_opt opts[] = {{"--to", &to, NULL}, {0}};
	if (cmig_parse_args("shard", argc, argv, 1, opts, &o, &shard) != 0)
		return 2;
	if (!verb || !shard || (strcmp(verb, "drain") && strcmp(verb, "split")) ||
	    (strcmp(verb, "split") == 0 && !to)) {
		fprintf(stderr, "stripedb ctl shard: usage: shard drain SHARD [--to SHARD] [--wait] "
				"[--dry-run] | shard split SHARD --to NEW [--wait] [--dry-run]\n");
		return 2;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	if (!c)
		return 2;
	bson_t rt, chunks;
	bson_iter_t it;
	int rc = 1;
	if (cmig_routing(c, "all", &rt) != 0) {
		mongoc_client_destroy(c);
		return 1;
	}
	/* the other shards, for a drain without --to (round-robin) */
	bson_t cmd = BSON_INITIALIZER, sreply, sarr;
	char others[64][64];
	size_t nothers = 0;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (cmig_run(c, &cmd, &sreply) == 0 && cmig_sub(&sreply, "shards", &sarr) && bson_iter_init(&it, &sarr))
		while (bson_iter_next(&it) && nothers < 64) {
			bson_t s;
			if (!sdb_bson_iter_doc(&it, &s))
				continue;
			char sstate[32];
			cmig_sval(&s, "id", others[nothers], sizeof others[0]);
			cmig_sval(&s, "state", sstate, sizeof sstate);
			/* never onto a shard being removed (removeShard marks it draining) */
			if (strcmp(others[nothers], shard) != 0 && strcmp(sstate, "draining") != 0)
				nothers++;
		}
	bson_destroy(&sreply);
	bson_destroy(&cmd);
	char(*ids)[128] = NULL;
	size_t n = 0, cap = 0, owned = 0, k = 0;
	if (cmig_sub(&rt, "chunks", &chunks) && bson_iter_init(&it, &chunks)) {
		bson_iter_t it2 = it;
		while (bson_iter_next(&it2)) {
			bson_t ch;
			char s[64];
			if (!sdb_bson_iter_doc(&it2, &ch))
				continue;
			owned += strcmp(cmig_sval(&ch, "shard", s, sizeof s), shard) == 0;
		}
		size_t want = strcmp(verb, "split") == 0 ? owned / 2 : owned;
		while (bson_iter_next(&it) && k < want) {
			bson_t ch;
			char s[64], ns[256];
			if (!sdb_bson_iter_doc(&it, &ch))
				continue;
			if (strcmp(cmig_sval(&ch, "shard", s, sizeof s), shard) != 0)
				continue;
			const char *dst = to ? to : nothers ? others[k % nothers] : NULL;
			k++;
			if (!dst) {
				fprintf(stderr, "stripedb ctl shard drain: no other shard (that is "
						"not draining)\n");
				goto out;
			}
			cmig_sval(&ch, "ns", ns, sizeof ns);
			int64_t id = cmig_ival(&ch, "id");
			if (o.dry_run) {
				printf("would migrate %s chunk %" PRId64 " from %s to %s\n", ns, id, shard,
				       dst);
				continue;
			}
			if (n == cap) {
				cap = cap ? 2 * cap : 16;
				ids = sdb_realloc(ids, cap * sizeof *ids);
			}
			mig_opts o1 = o;
			o1.id = NULL;
			if (cmig_register(c, ns, id, shard, dst, &o1, ids[n], sizeof ids[0]) != 0)
				goto out;
			printf("%s\n", ids[n++]);
		}
	}
	fflush(stdout);
	rc = o.wait && n ? cmig_wait_all(ctx, c, ids, n) : 0;
out:
	free(ids);
	bson_destroy(&rt);
	mongoc_client_destroy(c);
	return rc;
}

/* ------------------------------------------------------------ chunk table helpers */

/* The chunks of ns ("all": every collection) from the routing table into *out (a heap
 * array the caller frees with free_chunks). Returns: their count, or (size_t)-1 when the
 * routing table could not be read. */
size_t cmig_load_chunks(mongoc_client_t *c, const char *ns, chunk_row **out)
{
	bson_t rt, chunks;
	bson_iter_t it;
	size_t n = 0, cap = 0;
	*out = NULL;
	if (cmig_routing(c, ns, &rt) != 0)
		return (size_t)-1;
	if (cmig_sub(&rt, "chunks", &chunks) && bson_iter_init(&it, &chunks))
		while (bson_iter_next(&it)) {
			bson_t ch, b;
			if (!sdb_bson_iter_doc(&it, &ch))
				continue;
			if (n == cap) {
				cap = cap ? 2 * cap : 32;
				*out = sdb_realloc(*out, cap * sizeof **out);
			}
			chunk_row *r = &(*out)[n++];
			r->id = cmig_ival(&ch, "id");
			cmig_sval(&ch, "ns", r->ns, sizeof r->ns);
			cmig_sval(&ch, "shard", r->shard, sizeof r->shard);
			r->min = cmig_sub(&ch, "min", &b) ? bson_copy(&b) : bson_new();
			r->max = cmig_sub(&ch, "max", &b) ? bson_copy(&b) : bson_new();
		}
	bson_destroy(&rt);
	return n;
}

void cmig_free_chunks(chunk_row *r, size_t n)
{
	for (size_t i = 0; i < n && r; i++) {
		bson_destroy(r[i].min);
		bson_destroy(r[i].max);
	}
	free(r);
}

/* Register migrations of chunks sel[] to dst[] (or print them for --dry-run); wait. */
static int run_plan(struct cli_ctx *ctx, mongoc_client_t *c, chunk_row *rows, size_t n,
		    const char *const *dst, const mig_opts *o)
{
	char(*ids)[128] = NULL;
	size_t k = 0;
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		if (!dst[i])
			continue;
		if (o->dry_run) {
			printf("would migrate %s chunk %" PRId64 " from %s to %s\n", rows[i].ns,
			       rows[i].id, rows[i].shard, dst[i]);
			continue;
		}
		ids = sdb_realloc(ids, (k + 1) * sizeof *ids);
		mig_opts o1 = *o;
		o1.id = NULL;
		if (cmig_register(c, rows[i].ns, rows[i].id, rows[i].shard, dst[i], &o1, ids[k],
				 sizeof ids[0]) != 0) {
			rc = 1;
			break;
		}
		printf("%s\n", ids[k++]);
	}
	fflush(stdout);
	if (rc == 0 && o->wait && k)
		rc = cmig_wait_all(ctx, c, ids, k);
	free(ids);
	return rc;
}

/* `ctl rebalance --bin-pack` (argv after "rebalance"). Returns: the exit code, 0, 1
 * cluster error or a migration that failed, 2 usage. */
int cli_rebalance_main(struct cli_ctx *ctx, int argc, char **argv)
{
	mig_opts o = {.grace_ms = -1};
	int bin_pack = 0;
	const arg_opt opts[] = {{"--bin-pack", NULL, &bin_pack}, {0}};
	if (cmig_parse_args("rebalance", argc, argv, 0, opts, &o, NULL) != 0)
		return 2;
	if (!bin_pack) {
		fprintf(stderr, "stripedb ctl rebalance: usage: rebalance --bin-pack [--dry-run] "
				"[--wait]\n");
		return 2;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	if (!c)
		return 2;
	chunk_row *rows;
	size_t n = cmig_load_chunks(c, "all", &rows);
	int rc = 1;
	if (n == (size_t)-1)
		goto out;
	/* chunk count per shard that owns any */
	char shards[64][64];
	size_t cnt[64] = {0}, ns = 0;
	for (size_t i = 0; i < n; i++) {
		size_t j = 0;
		while (j < ns && strcmp(shards[j], rows[i].shard))
			j++;
		if (j == ns && ns < 64)
			snprintf(shards[ns++], sizeof shards[0], "%s", rows[i].shard);
		if (j < 64)
			cnt[j]++;
	}
	if (ns < 3) {
		printf("nothing to bin-pack: %zu shard(s) own chunks\n", ns);
		rc = 0;
		goto out;
	}
	size_t a = 0, b = 1;
	if (cnt[b] < cnt[a] || (cnt[b] == cnt[a] && strcmp(shards[b], shards[a]) < 0)) {
		a = 1;
		b = 0;
	}
	for (size_t j = 2; j < ns; j++) {
		if (cnt[j] < cnt[a] || (cnt[j] == cnt[a] && strcmp(shards[j], shards[a]) < 0)) {
			b = a;
			a = j;
		} else if (cnt[j] < cnt[b] || (cnt[j] == cnt[b] && strcmp(shards[j], shards[b]) < 0)) {
			b = j;
		}
	}
	if (is_draining(c, shards[b])) {
		/* never into a shard being removed: the least loaded one that is not draining */
		size_t best = ns;
		for (size_t j = 0; j < ns; j++)
			if (j != a && !is_draining(c, shards[j]) &&
			    (best == ns || cnt[j] < cnt[best]))
				best = j;
		if (best == ns) {
			printf("nothing to bin-pack: every other shard that owns chunks is draining\n");
			rc = 0;
			goto out;
		}
		b = best;
	}
	const char **dst = sdb_calloc(n ? n : 1, sizeof *dst);
	for (size_t i = 0; i < n; i++)
		if (strcmp(rows[i].shard, shards[a]) == 0)
			dst[i] = shards[b];
	printf("bin-pack: drain %s (%zu chunks) into %s (%zu chunks)\n", shards[a], cnt[a],
	       shards[b], cnt[b]);
	rc = run_plan(ctx, c, rows, n, dst, &o);
	free(dst);
out:
	cmig_free_chunks(rows, n == (size_t)-1 ? 0 : n);
	mongoc_client_destroy(c);
	return rc;
}

/* `ctl tenant isolate TENANT --to SHARD` (argv from the verb). Returns: the exit code,
 * 0, 1 cluster error or a migration that failed, 2 usage. */
int cli_tenant_main(struct cli_ctx *ctx, int argc, char **argv)
{
	mig_opts o = {.grace_ms = -1};
	const char *tenant = NULL, *to = NULL;
	const arg_opt opts[] = {{"--to", &to, NULL}, {0}};
	if (cmig_parse_args("tenant", argc, argv, 1, opts, &o, &tenant) != 0)
		return 2;
	if (argc < 1 || strcmp(argv[0], "isolate") != 0 || !tenant || !to) {
		fprintf(stderr, "stripedb ctl tenant: usage: tenant isolate TENANT --to SHARD "
				"[--dry-run] [--wait]\n");
		return 2;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	if (!c)
		return 2;
	bson_t cmd = BSON_INITIALIZER, reply, arr;
	bson_iter_t it;
	char dbs[256][128];
	size_t ndb = 0;
	int rc = 1;
	BSON_APPEND_INT32(&cmd, "listDatabases", 1);
	if (cmig_run(c, &cmd, &reply) == 0 && cmig_sub(&reply, "databases", &arr) && bson_iter_init(&it, &arr))
		while (bson_iter_next(&it) && ndb < 256) {
			bson_t d;
			char t[128];
			if (!sdb_bson_iter_doc(&it, &d))
				continue;
			if (strcmp(cmig_sval(&d, "tenant", t, sizeof t), tenant) == 0)
				cmig_sval(&d, "name", dbs[ndb++], sizeof dbs[0]);
		}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	chunk_row *rows;
	size_t n = cmig_load_chunks(c, "all", &rows);
	if (n == (size_t)-1) {
		mongoc_client_destroy(c);
		return 1;
	}
	const char **dst = sdb_calloc(n ? n : 1, sizeof *dst);
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < ndb; j++) {
			size_t l = strlen(dbs[j]);
			if (strncmp(rows[i].ns, dbs[j], l) == 0 && rows[i].ns[l] == '.' &&
			    strcmp(rows[i].shard, to) != 0)
				dst[i] = to;
		}
	rc = run_plan(ctx, c, rows, n, dst, &o);
	free(dst);
	cmig_free_chunks(rows, n);
	mongoc_client_destroy(c);
	return rc;
}

/* `ctl chunk list|split|merge DB.COLL` (argv from the verb). Returns: the exit code, 0,
 * 1 cluster error, 2 usage. */
int cli_chunk_main(struct cli_ctx *ctx, int argc, char **argv)
{
	const char *verb = argc > 0 ? argv[0] : NULL, *ns = NULL, *at = NULL, *ids = NULL;
	const arg_opt opts[] = {
		{"--at", &at, NULL}, {"--chunks", &ids, NULL}, {"--json", NULL, &ctx->json}, {0}};
	if (cmig_parse_args("chunk", argc, argv, 1, opts, NULL, &ns) != 0)
		return 2;
	if (!verb || !ns || (strcmp(verb, "split") == 0 && !at) ||
	    (strcmp(verb, "merge") == 0 && !ids) ||
	    (strcmp(verb, "list") && strcmp(verb, "split") && strcmp(verb, "merge"))) {
		fprintf(stderr, "stripedb ctl chunk: usage: chunk list DB.COLL | chunk split DB.COLL "
				"--at '{\"k\": V}' | chunk merge DB.COLL --chunks A,B\n");
		return 2;
	}
	bson_error_t e;
	bson_t *key = NULL;
	if (at && !(key = bson_new_from_json((const uint8_t *)at, -1, &e))) {
		fprintf(stderr, "stripedb ctl chunk split: --at: %s\n", e.message);
		return 2;
	}
	mongoc_client_t *c = cli_meta_client(ctx);
	if (!c) {
		if (key)
			bson_destroy(key);
		return 2;
	}
	chunk_row *rows;
	size_t n = cmig_load_chunks(c, ns, &rows);
	int rc = 1;
	if (n == (size_t)-1)
		goto out;
	if (strcmp(verb, "list") == 0) {
		for (size_t i = 0; i < n; i++) {
			char *mn = bson_as_relaxed_extended_json(rows[i].min, NULL);
			char *mx = bson_as_relaxed_extended_json(rows[i].max, NULL);
			if (ctx->json)
				printf("{\"id\": %" PRId64 ", \"shard\": \"%s\", \"min\": %s, \"max\": %s}\n",
				       rows[i].id, rows[i].shard, mn, mx);
			else
				printf("%-8" PRId64 " %-10s %s .. %s\n", rows[i].id, rows[i].shard, mn, mx);
			bson_free(mn);
			bson_free(mx);
		}
		rc = 0;
	} else if (strcmp(verb, "split") == 0) {
		bson_t cmd = BSON_INITIALIZER, reply;
		int64_t id = 0;
		for (size_t i = 0; i < n; i++)
			if (route_key_cmp(rows[i].min, key) < 0 && route_key_cmp(key, rows[i].max) < 0)
				id = rows[i].id;
		if (id == 0) {
			fprintf(stderr, "stripedb ctl chunk split: no chunk has %s strictly inside\n", at);
			bson_destroy(&cmd);
			goto out;
		}
		BSON_APPEND_INT64(&cmd, "splitChunk", id);
		BSON_APPEND_DOCUMENT(&cmd, "at", key);
		if (cmig_run(c, &cmd, &reply) == 0) {
			printf("split chunk %" PRId64 ": left %" PRId64 ", right %" PRId64 "\n", id,
			       cmig_ival(&reply, "left"), cmig_ival(&reply, "right"));
			rc = 0;
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
	} else {
		bson_t cmd = BSON_INITIALIZER, reply, arr;
		char *list = sdb_strdup(ids), *save = NULL;
		uint32_t k = 0;
		BSON_APPEND_UTF8(&cmd, "mergeChunks", ns);
		BSON_APPEND_ARRAY_BEGIN(&cmd, "ids", &arr);
		for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
			char kk[16];
			snprintf(kk, sizeof kk, "%u", k++);
			BSON_APPEND_INT64(&arr, kk, atoll(t));
		}
		bson_append_array_end(&cmd, &arr);
		free(list);
		if (cmig_run(c, &cmd, &reply) == 0) {
			printf("merged into chunk %" PRId64 "\n", cmig_ival(&reply, "merged"));
			rc = 0;
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
out:
	cmig_free_chunks(rows, n == (size_t)-1 ? 0 : n);
	if (key)
		bson_destroy(key);
	mongoc_client_destroy(c);
	return rc;
}
