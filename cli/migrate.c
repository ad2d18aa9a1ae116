/* `stripedb ctl` subcommands of the Data Movement Platform (issue #8, DESIGN.md §3a, §6):
 *
 *   migrate DB.COLL --chunk ID --to SHARD [--wait] [--dry-run] [--max-pause-ms=N]
 *           [--grace-ms=N] [--import-order=index|arrival] [--id=ID]
 *       register a migration of one chunk (the coordinators run it); --dry-run prints the
 *       plan; --wait follows it to a terminal state (exit 0 on complete, 1 otherwise).
 *   migration list [--json]       every migration: id, ns, chunk, from -> to, state
 *   migration status ID [--json]  state, per-phase counts, lag, switch pauses
 *   migration rollback ID         before the switch: abort; after it (switched): traffic
 *                                 back to the source (the coordinator runs rolling_back)
 *   migration pause ID            pause replication (takes the lease mig-pause/ID for 24 h)
 *   migration resume ID           resume it (releases that lease)
 *   shard drain SHARD [--to SHARD] [--wait] [--dry-run]   move every chunk off SHARD
 *   shard split SHARD --to NEW [--wait] [--dry-run]        move half of SHARD's chunks
 *
 * Talks only to metadata (registerMigration, updateMigration with expectState,
 * getMigration, listMigrations, getRoutingTable). Exit codes: 0 ok, 1 cluster error or a
 * migration that ended other than complete, 2 bad usage.
 */
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "coordinator/migrate.h"

/* Same members as in cli/ctl.c (compatible type, C11 6.2.7) until cli.h exports it. */
struct cli_ctx {
	const char *metadata;
	int json;
	int timeout_ms;
};

int cli_migrate_main(struct cli_ctx *ctx, int argc, char **argv);
int cli_migration_main(struct cli_ctx *ctx, int argc, char **argv);
int cli_shard_main(struct cli_ctx *ctx, int argc, char **argv);

static mongoc_client_t *meta_client(struct cli_ctx *ctx)
{
	char *u = sdb_asprintf("mongodb://%s/?replicaSet=stripedb-meta&serverSelectionTimeoutMS=%d"
			       "&connectTimeoutMS=%d",
			       ctx->metadata, ctx->timeout_ms, ctx->timeout_ms);
	mongoc_client_t *c = mongoc_client_new(u);
	free(u);
	if (c)
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	else
		fprintf(stderr, "stripedb ctl: bad metadata address '%s'\n", ctx->metadata);
	return c;
}

static int run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply)
{
	bson_error_t e;
	if (mongoc_client_command_simple(c, "admin", cmd, NULL, reply, &e))
		return 0;
	fprintf(stderr, "stripedb ctl: %s\n", e.message);
	return e.domain == MONGOC_ERROR_SERVER ? (int)e.code : -1;
}

static const char *sval(const bson_t *d, const char *k, char *buf, size_t n)
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

static int64_t ival(const bson_t *d, const char *k)
{
	bson_iter_t it;
	return bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it)
									      : 0;
}

static bool sub(const bson_t *d, const char *k, bson_t *out)
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

static void print_json(const bson_t *d)
{
	char *j = bson_as_relaxed_extended_json(d, NULL);
	printf("%s\n", j);
	bson_free(j);
}

/* The chunks of ns: heap copy of the getRoutingTable reply (caller destroys). */
static int routing(mongoc_client_t *c, const char *ns, bson_t *reply)
{
	bson_t cmd = BSON_INITIALIZER;
	BSON_APPEND_UTF8(&cmd, "getRoutingTable", ns);
	BSON_APPEND_INT64(&cmd, "sinceVersion", 0);
	int rc = run(c, &cmd, reply);
	bson_destroy(&cmd);
	return rc;
}

typedef struct mig_opts {
	int64_t max_pause_ms, grace_ms;
	const char *order, *id;
	int wait, dry_run;
} mig_opts;

/* registerMigration; id into idbuf. */
static int register_one(mongoc_client_t *c, const char *ns, int64_t chunk, const char *from,
			const char *to, const mig_opts *o, char *idbuf, size_t idlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (o->id)
		snprintf(idbuf, idlen, "%s", o->id);
	else
		snprintf(idbuf, idlen, "mig-%" PRId64 "-%" PRIx64 "%04x", chunk,
			 (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, (unsigned)(getpid() & 0xffff));
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
	int rc = run(c, &cmd, &reply);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

static int get_mig(mongoc_client_t *c, const char *id, bson_t *out)
{
	bson_t cmd = BSON_INITIALIZER, reply, m;
	BSON_APPEND_UTF8(&cmd, "getMigration", id);
	int rc = run(c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc == 0 && sub(&reply, "migration", &m))
		bson_copy_to(&m, out);
	else if (rc == 0)
		rc = -1;
	bson_destroy(&reply);
	return rc;
}

static void print_status(struct cli_ctx *ctx, const bson_t *m)
{
	char id[128], st[32], ns[256], from[64], to[64], chunk[32];
	bson_t spec, stats, v, p;
	if (ctx->json) {
		print_json(m);
		return;
	}
	sval(m, "id", id, sizeof id);
	sval(m, "state", st, sizeof st);
	sval(m, "ns", ns, sizeof ns);
	from[0] = to[0] = chunk[0] = '\0';
	if (sub(m, "spec", &spec)) {
		sval(&spec, "from", from, sizeof from);
		sval(&spec, "to", to, sizeof to);
		sval(&spec, "chunk", chunk, sizeof chunk);
	}
	printf("%s  %s chunk %s  %s -> %s  state %s\n", id, ns, chunk, from, to, st);
	if (sub(m, "stats", &stats)) {
		printf("  import     %" PRId64 " docs, %" PRId64 " bytes in %" PRId64 " ms\n",
		       ival(&stats, "imported"), ival(&stats, "importBytes"), ival(&stats, "importMS"));
		printf("  replicate  %" PRId64 " applied, %" PRId64 " skipped, lag %" PRId64 " ms\n",
		       ival(&stats, "applied"), ival(&stats, "skipped"), ival(&stats, "lagMS"));
		if (sub(&stats, "verify", &v))
			printf("  verify     %" PRId64 " docs, %" PRId64 " missing, %" PRId64
			       " extra, %" PRId64 " different\n",
			       ival(&v, "count"), ival(&v, "missing"), ival(&v, "extra"),
			       ival(&v, "different"));
		printf("  switch     pause %" PRId64 " ms, %" PRId64 " attempts", ival(&stats, "pauseMS"),
		       ival(&stats, "switchAttempts"));
		if (sub(&stats, "pausesMS", &p)) {
			bson_iter_t it;
			printf(" (all:");
			bson_iter_init(&it, &p);
			while (bson_iter_next(&it))
				printf(" %" PRId64, bson_iter_as_int64(&it));
			printf(")");
		}
		printf("\n  reverse    %" PRId64 " applied; cleanup deleted %" PRId64 "\n",
		       ival(&stats, "reverseApplied"), ival(&stats, "deleted"));
		char e[512];
		if (sval(&stats, "error", e, sizeof e)[0])
			printf("  error      %s\n", e);
	}
}

/* Poll until every id is terminal. Returns 0 when all completed, 1 otherwise. */
static int wait_all(struct cli_ctx *ctx, mongoc_client_t *c, char ids[][128], size_t n)
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
			sval(&m, "state", st, sizeof st);
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

int cli_migrate_main(struct cli_ctx *ctx, int argc, char **argv)
{
	const char *ns = NULL, *to = NULL;
	int64_t chunk = 0;
	mig_opts o = {.grace_ms = -1};
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (parse_common(a, &o))
			continue;
		if (strcmp(a, "--chunk") == 0 && i + 1 < argc)
			chunk = atoll(argv[++i]);
		else if (strncmp(a, "--chunk=", 8) == 0)
			chunk = atoll(a + 8);
		else if (strcmp(a, "--to") == 0 && i + 1 < argc)
			to = argv[++i];
		else if (strncmp(a, "--to=", 5) == 0)
			to = a + 5;
		else if (a[0] != '-' && !ns)
			ns = a;
		else {
			fprintf(stderr, "stripedb ctl migrate: unexpected argument '%s'\n", a);
			return 2;
		}
	}
	if (!ns || !strchr(ns, '.') || chunk <= 0 || !to ||
	    (o.order && strcmp(o.order, "index") && strcmp(o.order, "arrival"))) {
		fprintf(stderr, "stripedb ctl migrate: usage: migrate DB.COLL --chunk ID --to SHARD "
				"[--wait] [--dry-run] [--max-pause-ms=N] [--grace-ms=N] "
				"[--import-order=index|arrival]\n");
		return 2;
	}
	mongoc_client_t *c = meta_client(ctx);
	if (!c)
		return 2;
	bson_t rt;
	int rc = 1;
	if (routing(c, ns, &rt) != 0)
		goto out_client;
	bson_t chunks;
	bson_iter_t it;
	char from[64] = "";
	if (sub(&rt, "chunks", &chunks) && bson_iter_init(&it, &chunks))
		while (bson_iter_next(&it)) {
			bson_t ch;
			const uint8_t *data;
			uint32_t len;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				continue;
			bson_iter_document(&it, &len, &data);
			bson_init_static(&ch, data, len);
			if (ival(&ch, "id") == chunk)
				sval(&ch, "shard", from, sizeof from);
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
	if (register_one(c, ns, chunk, from, to, &o, ids[0], sizeof ids[0]) != 0)
		goto out;
	if (ctx->json)
		printf("{\"id\": \"%s\"}\n", ids[0]);
	else
		printf("%s\n", ids[0]);
	fflush(stdout);
	rc = o.wait ? wait_all(ctx, c, ids, 1) : 0;
out:
	bson_destroy(&rt);
out_client:
	mongoc_client_destroy(c);
	return rc;
}

static int migration_list(struct cli_ctx *ctx, mongoc_client_t *c)
{
	bson_t cmd = BSON_INITIALIZER, reply, arr;
	bson_iter_t it;
	BSON_APPEND_INT32(&cmd, "listMigrations", 1);
	int rc = run(c, &cmd, &reply);
	bson_destroy(&cmd);
	if (rc != 0) {
		bson_destroy(&reply);
		return 1;
	}
	if (ctx->json) {
		bson_t out = BSON_INITIALIZER;
		if (sub(&reply, "migrations", &arr))
			BSON_APPEND_ARRAY(&out, "migrations", &arr);
		print_json(&out);
		bson_destroy(&out);
	} else if (sub(&reply, "migrations", &arr) && bson_iter_init(&it, &arr)) {
		printf("%-32s %-20s %-8s %-10s %-10s %s\n", "ID", "NS", "CHUNK", "FROM", "TO", "STATE");
		while (bson_iter_next(&it)) {
			bson_t m, spec;
			const uint8_t *data;
			uint32_t len;
			char id[128], ns[256], st[32], from[64] = "", to[64] = "", ch[32] = "";
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				continue;
			bson_iter_document(&it, &len, &data);
			bson_init_static(&m, data, len);
			if (sub(&m, "spec", &spec)) {
				sval(&spec, "from", from, sizeof from);
				sval(&spec, "to", to, sizeof to);
				sval(&spec, "chunk", ch, sizeof ch);
			}
			printf("%-32s %-20s %-8s %-10s %-10s %s\n", sval(&m, "id", id, sizeof id),
			       sval(&m, "ns", ns, sizeof ns), ch, from, to, sval(&m, "state", st, sizeof st));
		}
	}
	bson_destroy(&reply);
	return 0;
}

static int migration_rollback(mongoc_client_t *c, const char *id)
{
	for (int tries = 0; tries < 50; tries++) {
		bson_t m;
		char st[32];
		if (get_mig(c, id, &m) != 0)
			return 1;
		sval(&m, "state", st, sizeof st);
		bson_destroy(&m);
		mig_state s = migrate_state_parse(st);
		mig_state to;
		if (s == MIG_SWITCHED)
			to = MIG_ROLLING_BACK;
		else if (s == MIG_REGISTERED || s == MIG_IMPORTING || s == MIG_REPLICATING ||
			 s == MIG_VERIFYING)
			to = MIG_ABORTED;
		else if (s == MIG_SWITCHING) {
			usleep(100000); /* transient: wait for its outcome */
			continue;
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
	int rc = run(c, &cmd, &reply);
	bson_destroy(&cmd);
	bson_destroy(&reply);
	if (rc == 0)
		printf("%s: replication %s\n", id, pause ? "paused" : "resumed");
	return rc == 0 ? 0 : 1;
}

int cli_migration_main(struct cli_ctx *ctx, int argc, char **argv)
{
	int json = ctx->json;
	const char *verb = argc > 0 ? argv[0] : NULL, *id = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = 1;
		else if (!id && argv[i][0] != '-')
			id = argv[i];
		else {
			fprintf(stderr, "stripedb ctl migration: unexpected argument '%s'\n", argv[i]);
			return 2;
		}
	}
	ctx->json = json;
	if (!verb || (strcmp(verb, "list") != 0 && !id) ||
	    (strcmp(verb, "list") && strcmp(verb, "status") && strcmp(verb, "rollback") &&
	     strcmp(verb, "pause") && strcmp(verb, "resume"))) {
		fprintf(stderr, "stripedb ctl migration: usage: migration list | status ID | rollback ID "
				"| pause ID | resume ID [--json]\n");
		return 2;
	}
	mongoc_client_t *c = meta_client(ctx);
	if (!c)
		return 2;
	int rc;
	if (strcmp(verb, "list") == 0) {
		rc = migration_list(ctx, c);
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
		rc = migration_rollback(c, id);
	}
	mongoc_client_destroy(c);
	return rc;
}

/* shard drain / split: one migration per chunk, spread over the routing table. */
int cli_shard_main(struct cli_ctx *ctx, int argc, char **argv)
{
	const char *verb = argc > 0 ? argv[0] : NULL, *shard = NULL, *to = NULL;
	mig_opts o = {.grace_ms = -1};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (parse_common(a, &o))
			continue;
		if (strcmp(a, "--to") == 0 && i + 1 < argc)
			to = argv[++i];
		else if (strncmp(a, "--to=", 5) == 0)
			to = a + 5;
		else if (a[0] != '-' && !shard)
			shard = a;
		else {
			fprintf(stderr, "stripedb ctl shard: unexpected argument '%s'\n", a);
			return 2;
		}
	}
	if (!verb || !shard || (strcmp(verb, "drain") && strcmp(verb, "split")) ||
	    (strcmp(verb, "split") == 0 && !to)) {
		fprintf(stderr, "stripedb ctl shard: usage: shard drain SHARD [--to SHARD] [--wait] "
				"[--dry-run] | shard split SHARD --to NEW [--wait] [--dry-run]\n");
		return 2;
	}
	mongoc_client_t *c = meta_client(ctx);
	if (!c)
		return 2;
	bson_t rt, chunks;
	bson_iter_t it;
	int rc = 1;
	if (routing(c, "all", &rt) != 0) {
		mongoc_client_destroy(c);
		return 1;
	}
	/* the other shards, for a drain without --to (round-robin) */
	bson_t cmd = BSON_INITIALIZER, sreply, sarr;
	char others[64][64];
	size_t nothers = 0;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (run(c, &cmd, &sreply) == 0 && sub(&sreply, "shards", &sarr) && bson_iter_init(&it, &sarr))
		while (bson_iter_next(&it) && nothers < 64) {
			bson_t s;
			const uint8_t *data;
			uint32_t len;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				continue;
			bson_iter_document(&it, &len, &data);
			bson_init_static(&s, data, len);
			sval(&s, "id", others[nothers], sizeof others[0]);
			if (strcmp(others[nothers], shard) != 0)
				nothers++;
		}
	bson_destroy(&sreply);
	bson_destroy(&cmd);
	char(*ids)[128] = NULL;
	size_t n = 0, cap = 0, owned = 0, k = 0;
	if (sub(&rt, "chunks", &chunks) && bson_iter_init(&it, &chunks)) {
		bson_iter_t it2 = it;
		while (bson_iter_next(&it2)) {
			bson_t ch;
			const uint8_t *data;
			uint32_t len;
			char s[64];
			if (!BSON_ITER_HOLDS_DOCUMENT(&it2))
				continue;
			bson_iter_document(&it2, &len, &data);
			bson_init_static(&ch, data, len);
			owned += strcmp(sval(&ch, "shard", s, sizeof s), shard) == 0;
		}
		size_t want = strcmp(verb, "split") == 0 ? owned / 2 : owned;
		while (bson_iter_next(&it) && k < want) {
			bson_t ch;
			const uint8_t *data;
			uint32_t len;
			char s[64], ns[256];
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				continue;
			bson_iter_document(&it, &len, &data);
			bson_init_static(&ch, data, len);
			if (strcmp(sval(&ch, "shard", s, sizeof s), shard) != 0)
				continue;
			const char *dst = to ? to : nothers ? others[k % nothers] : NULL;
			k++;
			if (!dst) {
				fprintf(stderr, "stripedb ctl shard drain: no other shard\n");
				goto out;
			}
			sval(&ch, "ns", ns, sizeof ns);
			int64_t id = ival(&ch, "id");
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
			if (register_one(c, ns, id, shard, dst, &o1, ids[n], sizeof ids[0]) != 0)
				goto out;
			printf("%s\n", ids[n++]);
		}
	}
	fflush(stdout);
	rc = o.wait && n ? wait_all(ctx, c, ids, n) : 0;
out:
	free(ids);
	bson_destroy(&rt);
	mongoc_client_destroy(c);
	return rc;
}
