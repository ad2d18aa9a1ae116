/* `stripedb ctl top`: a text view of the cluster (issue #9).
 *
 *   stripedb ctl [--metadata=H:P,...] [--json] top [--once] [--json] [--dir DIR]
 *                [--interval-ms N]
 *
 * Shards (listShards) with their chunks (getRoutingTable "all"), documents and bytes (each
 * shard's listDatabases + dbStats over the wire) and commands per second, and under each
 * shard its replica-set members (replSetGetStatus on each: state, term, applied index, who
 * is primary, and the lag in Raft entries and ms that the primary reports for every
 * member, one that does not answer included; cli/shardset.h); migrations in
 * flight (listMigrations: every state but complete, aborted, rolled_back) with their
 * progress. QPS is the rate of stripedb_wire_commands_total on each shard's /metrics between
 * two samples: metadata does not record HTTP ports, so it needs the shard's metrics address,
 * from a `stripedb dev` cluster directory (--dir or STRIPEDB_DEV_DIR); without one the column
 * shows "-". --metadata is required as for every ctl subcommand. On a terminal the view refreshes every second until Ctrl-C; with --once, --json
 * or when stdout is not a terminal it prints once (QPS then from two samples 1 s apart).
 * Exit codes: 0, 1 metadata unreachable, 2 bad usage.
 */
#include <curl/curl.h>
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/dev.h"
#include "cli/shardset.h"
#include "auth/cluster.h"
#include "common/clock.h"
#include "common/alloc.h"
#include "common/metauri.h"

#define TOP_MAX_SHARDS 64
#define TOP_MAX_MIGS 64


int cli_top_main(struct cli_ctx *ctx, int argc, char **argv);

typedef struct top_shard {
	char id[64], uri[256], state[32];
	int64_t chunks, docs, bytes;
	int http[SHARDSET_MAX]; /* metrics ports of its members (dev cluster), nhttp of them */
	int nhttp;
	shardset_member members[SHARDSET_MAX]; /* replSetGetStatus of each member */
	int nmembers;
	double cmds;       /* last stripedb_wire_commands_total sample, -1 unknown */
	double qps;        /* -1 unknown */
} top_shard;

typedef struct top_mig {
	char id[128], ns[128], from[64], to[64], state[32];
	int64_t chunk, imported, lag_ms;
} top_mig;

typedef struct top_view {
	top_shard shards[TOP_MAX_SHARDS];
	int nshards;
	top_mig migs[TOP_MAX_MIGS];
	int nmigs;
	int64_t routing_version;
} top_view;

static volatile sig_atomic_t top_stop;

static void top_on_signal(int sig)
{
	(void)sig;
	top_stop = 1;
}


static int64_t top_i64(const bson_t *d, const char *k)
{
	bson_iter_t it;

	return bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_NUMBER(&it) ? bson_iter_as_int64(&it) : 0;
}

static void top_str(const bson_t *d, const char *k, char *buf, size_t n)
{
	bson_iter_t it;

	buf[0] = '\0';
	if (bson_iter_init_find(&it, d, k) && BSON_ITER_HOLDS_UTF8(&it)) {
		snprintf(buf, n, "%s", bson_iter_utf8(&it, NULL));
	}
}

static int top_sub(const bson_t *d, const char *k, bson_t *out)
{
	bson_iter_t it;
	const uint8_t *data;
	uint32_t len;

	if (!bson_iter_init_find(&it, d, k)) {
		return 0;
	}
	if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
		bson_iter_document(&it, &len, &data);
	} else if (BSON_ITER_HOLDS_ARRAY(&it)) {
		bson_iter_array(&it, &len, &data);
	} else {
		return 0;
	}
	return bson_init_static(out, data, len);
}

/* Iterate the documents of array k of d. */
#define TOP_EACH(d, k, arr, it, elem)                                                            \
	for (int ok_ = top_sub(d, k, &arr) && bson_iter_init(&it, &arr); ok_ && bson_iter_next(&it);) \
		if (BSON_ITER_HOLDS_DOCUMENT(&it) && top_doc(&it, &elem))

static int top_doc(bson_iter_t *it, bson_t *out)
{
	const uint8_t *data;
	uint32_t len;

	bson_iter_document(it, &len, &data);
	return bson_init_static(out, data, len);
}

typedef struct top_buf {
	char *p;
	size_t n;
} top_buf;

static size_t top_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
	top_buf *b = ud;
	size_t add = size * nmemb;

	if (b->n + add > 8u << 20) {
		return 0; /* a /metrics page over 8 MiB: not ours */
	}
	b->p = sdb_realloc(b->p, b->n + add + 1);
	memcpy(b->p + b->n, ptr, add);
	b->n += add;
	b->p[b->n] = '\0';
	return add;
}

/* Sum of every stripedb_wire_commands_total series on http://127.0.0.1:port/metrics, or -1. */
static double top_commands(int port)
{
	char url[96];
	top_buf b = {NULL, 0};
	CURL *h = curl_easy_init();
	double sum = -1;

	if (h == NULL) {
		return -1;
	}
	snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, top_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	if (curl_easy_perform(h) == CURLE_OK && b.p != NULL) {
		const char *name = "stripedb_wire_commands_total";
		sum = 0;
		for (char *line = b.p; line != NULL && *line != '\0';) {
			char *nl = strchr(line, '\n');
			if (nl != NULL) {
				*nl = '\0';
			}
			if (strncmp(line, name, strlen(name)) == 0) {
				char *sp = strrchr(line, ' ');
				if (sp != NULL) {
					sum += strtod(sp + 1, NULL);
				}
			}
			line = nl ? nl + 1 : NULL;
		}
	}
	curl_easy_cleanup(h);
	free(b.p);
	return sum;
}

static int top_cmd(mongoc_client_t *c, const char *db, bson_t *cmd, bson_t *reply)
{
	bson_error_t e;
	int ok = mongoc_client_command_simple(c, db, cmd, NULL, reply, &e);

	bson_destroy(cmd);
	if (!ok) {
		fprintf(stderr, "stripedb ctl top: %s\n", e.message);
	}
	return ok ? 0 : -1;
}

/* Documents and bytes of one shard: listDatabases, then dbStats of each database. */
static void top_shard_size(top_shard *s, int timeout_ms)
{
	char *uri = sdb_asprintf("%s%sserverSelectionTimeoutMS=%d&connectTimeoutMS=%d", s->uri,
				 strchr(s->uri, '?') ? "&" : "/?", timeout_ms, timeout_ms);
	mongoc_client_t *c = auth_cluster_client_new(uri);
	bson_t reply, arr, d;
	bson_iter_t it;

	free(uri);
	s->docs = s->bytes = -1;
	if (c == NULL) {
		return;
	}
	if (top_cmd(c, "admin", BCON_NEW("listDatabases", BCON_INT32(1)), &reply) == 0) {
		s->docs = s->bytes = 0;
		TOP_EACH(&reply, "databases", arr, it, d)
		{
			char name[128];
			bson_t st;
			top_str(&d, "name", name, sizeof name);
			if (name[0] == '\0' || strcmp(name, "local") == 0 || strcmp(name, "config") == 0) {
				continue;
			}
			if (top_cmd(c, name, BCON_NEW("dbStats", BCON_INT32(1)), &st) == 0) {
				s->docs += top_i64(&st, "objects");
				s->bytes += top_i64(&st, "dataSize");
			}
			bson_destroy(&st);
		}
	}
	bson_destroy(&reply);
	mongoc_client_destroy(c);
}

static int top_collect(struct cli_ctx *ctx, mongoc_client_t *m, const dev_cluster *dev, top_view *v)
{
	bson_t reply, arr, d;
	bson_iter_t it;

	v->nshards = 0;
	v->nmigs = 0;
	if (top_cmd(m, "admin", BCON_NEW("listShards", BCON_INT32(1)), &reply) != 0) {
		bson_destroy(&reply);
		return -1;
	}
	TOP_EACH(&reply, "shards", arr, it, d)
	{
		top_shard *s;
		if (v->nshards == TOP_MAX_SHARDS) {
			break;
		}
		s = &v->shards[v->nshards++];
		memset(s, 0, sizeof *s);
		top_str(&d, "id", s->id, sizeof s->id);
		top_str(&d, "uri", s->uri, sizeof s->uri);
		top_str(&d, "state", s->state, sizeof s->state);
		s->cmds = s->qps = -1;
		for (int i = 0; dev != NULL && i < dev->n; i++) {
			if ((strcmp(dev->procs[i].name, s->id) == 0 || strcmp(dev->procs[i].set, s->id) == 0) &&
			    s->nhttp < SHARDSET_MAX) {
				s->http[s->nhttp++] = dev->procs[i].http;
			}
		}
	}
	bson_destroy(&reply);
	/* the chunks of every collection by cursor (issue #26: batches of at most 8 MB, any
	 * table size); the first batch's version is the table's */
	{
		bson_t resume = BSON_INITIALIZER;
		bool more = true, first = true;
		while (more) {
			bson_t *cmd = BCON_NEW("getRoutingTable", "all", "cursor", "{", "}");
			bson_t ra;
			bson_iter_t rit;
			if (!first)
				BSON_APPEND_DOCUMENT(cmd, "resumeAfter", &resume);
			if (top_cmd(m, "admin", cmd, &reply) != 0) {
				bson_destroy(&reply);
				break;
			}
			if (first)
				v->routing_version = top_i64(&reply, "routingVersion");
			first = false;
			TOP_EACH(&reply, "chunks", arr, it, d)
			{
				char sh[64];
				top_str(&d, "shard", sh, sizeof sh);
				for (int i = 0; i < v->nshards; i++) {
					if (strcmp(v->shards[i].id, sh) == 0) {
						v->shards[i].chunks++;
					}
				}
			}
			more = bson_iter_init_find(&rit, &reply, "more") && bson_iter_as_bool(&rit) &&
			       top_sub(&reply, "resumeAfter", &ra);
			if (more) {
				bson_reinit(&resume);
				bson_concat(&resume, &ra);
			}
			bson_destroy(&reply);
		}
		bson_destroy(&resume);
	}
	for (int i = 0; i < v->nshards; i++) {
		top_shard *s = &v->shards[i];
		top_shard_size(s, ctx->timeout_ms);
		s->nmembers = shardset_status(s->uri, ctx->timeout_ms, s->members, SHARDSET_MAX);
		for (int k = 0; k < s->nhttp; k++) { /* commands of every member of the set */
			double n = top_commands(s->http[k]);
			if (n >= 0) {
				s->cmds = (s->cmds < 0 ? 0 : s->cmds) + n;
			}
		}
	}
	if (top_cmd(m, "admin", BCON_NEW("listMigrations", BCON_INT32(1)), &reply) == 0) {
		TOP_EACH(&reply, "migrations", arr, it, d)
		{
			top_mig *g;
			bson_t spec, st;
			char state[32];
			top_str(&d, "state", state, sizeof state);
			if (strcmp(state, "complete") == 0 || strcmp(state, "aborted") == 0 ||
			    strcmp(state, "rolled_back") == 0 || v->nmigs == TOP_MAX_MIGS) {
				continue;
			}
			g = &v->migs[v->nmigs++];
			memset(g, 0, sizeof *g);
			snprintf(g->state, sizeof g->state, "%s", state);
			top_str(&d, "id", g->id, sizeof g->id);
			top_str(&d, "ns", g->ns, sizeof g->ns);
			if (top_sub(&d, "spec", &spec)) {
				top_str(&spec, "from", g->from, sizeof g->from);
				top_str(&spec, "to", g->to, sizeof g->to);
				g->chunk = top_i64(&spec, "chunk");
			}
			if (top_sub(&d, "stats", &st)) {
				g->imported = top_i64(&st, "imported");
				g->lag_ms = top_i64(&st, "lagMS");
			}
		}
	}
	bson_destroy(&reply);
	return 0;
}

static void top_rates(top_view *v, const top_view *prev, double secs)
{
	for (int i = 0; i < v->nshards; i++) {
		for (int j = 0; j < prev->nshards; j++) {
			if (strcmp(v->shards[i].id, prev->shards[j].id) == 0 && v->shards[i].cmds >= 0 &&
			    prev->shards[j].cmds >= 0 && secs > 0) {
				double d = v->shards[i].cmds - prev->shards[j].cmds;
				v->shards[i].qps = d < 0 ? 0 : d / secs;
			}
		}
	}
}

static void top_human(int64_t bytes, char *buf, size_t n)
{
	if (bytes < 0) {
		snprintf(buf, n, "-");
	} else if (bytes < 1024) {
		snprintf(buf, n, "%" PRId64 " B", bytes);
	} else if (bytes < 1024 * 1024) {
		snprintf(buf, n, "%.1f KiB", (double)bytes / 1024.0);
	} else {
		snprintf(buf, n, "%.1f MiB", (double)bytes / 1048576.0);
	}
}

static void top_print(struct cli_ctx *ctx, const top_view *v, int json)
{
	if (json) {
		printf("{\"metadata\": \"%s\", \"routingVersion\": %" PRId64 ", \"shards\": [",
		       ctx->metadata, v->routing_version);
		for (int i = 0; i < v->nshards; i++) {
			const top_shard *s = &v->shards[i];
			printf("%s{\"id\": \"%s\", \"state\": \"%s\", \"chunks\": %" PRId64 ", \"docs\": %" PRId64
			       ", \"bytes\": %" PRId64 ", \"qps\": ",
			       i ? ", " : "", s->id, s->state, s->chunks, s->docs, s->bytes);
			if (s->qps >= 0) {
				printf("%.1f", s->qps);
			} else {
				printf("null");
			}
			printf(", \"members\": [");
			for (int k = 0; k < s->nmembers; k++) {
				bson_t one = BSON_INITIALIZER;
				shardset_member_bson(&s->members[k], &one);
				char *j = bson_as_relaxed_extended_json(&one, NULL);
				printf("%s%s", k ? ", " : "", j);
				bson_free(j);
				bson_destroy(&one);
			}
			printf("]}");
		}
		printf("], \"migrations\": [");
		for (int i = 0; i < v->nmigs; i++) {
			const top_mig *g = &v->migs[i];
			printf("%s{\"id\": \"%s\", \"ns\": \"%s\", \"chunk\": %" PRId64 ", \"from\": \"%s\", "
			       "\"to\": \"%s\", \"state\": \"%s\", \"imported\": %" PRId64 ", \"lagMS\": %" PRId64 "}",
			       i ? ", " : "", g->id, g->ns, g->chunk, g->from, g->to, g->state, g->imported,
			       g->lag_ms);
		}
		printf("]}\n");
		return;
	}
	printf("stripedb top   metadata %s   routing version %" PRId64 "\n\n", ctx->metadata,
	       v->routing_version);
	printf("%-12s %-9s %7s %10s %11s %9s\n", "SHARD", "STATE", "CHUNKS", "DOCS", "SIZE", "QPS");
	for (int i = 0; i < v->nshards; i++) {
		const top_shard *s = &v->shards[i];
		char size[32], qps[32], docs[32];
		top_human(s->bytes, size, sizeof size);
		if (s->qps >= 0) {
			snprintf(qps, sizeof qps, "%.0f", s->qps);
		} else {
			snprintf(qps, sizeof qps, "-");
		}
		if (s->docs >= 0) {
			snprintf(docs, sizeof docs, "%" PRId64, s->docs);
		} else {
			snprintf(docs, sizeof docs, "down");
		}
		printf("%-12s %-9s %7" PRId64 " %10s %11s %9s\n", s->id, s->state[0] ? s->state : "-",
		       s->chunks, docs, size, qps);
		/* the replica set: each member's state, term and lag behind the primary (entries
		 * and ms, as the primary sees it: also for a member that does not answer) */
		for (int k = 0; k < s->nmembers; k++) {
			const shardset_member *m = &s->members[k];
			char lag[24], lag_ms[24];
			if (m->lag >= 0) {
				snprintf(lag, sizeof lag, "%" PRId64, m->lag);
			} else {
				snprintf(lag, sizeof lag, "-");
			}
			if (m->lag_ms >= 0) {
				snprintf(lag_ms, sizeof lag_ms, "%" PRId64 " ms", m->lag_ms);
			} else {
				snprintf(lag_ms, sizeof lag_ms, "-");
			}
			if (!m->reachable) {
				printf("  %-21s id %-2" PRId64 " %-10s %-10s %-16s lag %s (%s)\n", m->host,
				       m->id, "UNREACHABLE", "", "", lag, lag_ms);
				continue;
			}
			printf("  %-21s id %-2" PRId64 " %-10s term %-5" PRId64 " applied %-8" PRId64
			       " lag %s (%s)%s\n",
			       m->host, m->id, m->state, m->term, m->applied, lag, lag_ms,
			       m->is_primary ? "  <- primary" : "");
		}
	}
	printf("\nmigrations in flight: %d\n", v->nmigs);
	if (v->nmigs > 0) {
		printf("%-28s %-20s %6s  %-22s %-12s %9s %7s\n", "ID", "NS", "CHUNK", "FROM -> TO", "STATE",
		       "IMPORTED", "LAG ms");
	}
	for (int i = 0; i < v->nmigs; i++) {
		const top_mig *g = &v->migs[i];
		char route[160];
		snprintf(route, sizeof route, "%s -> %s", g->from, g->to);
		printf("%-28s %-20s %6" PRId64 "  %-22s %-12s %9" PRId64 " %7" PRId64 "\n", g->id, g->ns,
		       g->chunk, route, g->state, g->imported, g->lag_ms);
	}
}

int cli_top_main(struct cli_ctx *ctx, int argc, char **argv)
{
	const char *dir = getenv("STRIPEDB_DEV_DIR");
	int once = 0, json = ctx->json, interval = 1000, rc = 0;
	static top_view v, prev;
	dev_cluster *dev = NULL;
	mongoc_client_t *m;
	char *uri;
	uint64_t t_prev;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--once") == 0) {
			once = 1;
		} else if (strcmp(argv[i], "--json") == 0) {
			json = 1;
		} else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
			dir = argv[++i];
		} else if (strncmp(argv[i], "--dir=", 6) == 0) {
			dir = argv[i] + 6;
		} else if (strncmp(argv[i], "--interval-ms=", 14) == 0 && atoi(argv[i] + 14) >= 100) {
			interval = atoi(argv[i] + 14);
		} else {
			fprintf(stderr, "stripedb ctl top: usage: top [--once] [--json] [--dir DIR] "
					"[--interval-ms=N]\n");
			return 2;
		}
	}
	if (dir != NULL) {
		dev = sdb_calloc(1, sizeof *dev);
		if (dev_cluster_load(dir, dev) != 0) {
			free(dev);
			return 1;
		}
		if (ctx->metadata == NULL) {
			static char meta[512];
			dev_cluster_addrs(dev, "metadata", 0, meta, sizeof meta);
			ctx->metadata = meta;
		}
	}
	if (ctx->metadata == NULL) {
		fprintf(stderr, "stripedb ctl top: give --metadata=H:P,... (or STRIPEDB_METADATA, or "
				"--dir of a stripedb dev cluster)\n");
		rc = 2;
		goto out;
	}
	once = once || json || !isatty(1);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	uri = sdb_meta_uri(ctx->metadata, false, ctx->timeout_ms, 0, 0);
	m = auth_cluster_client_new(uri);
	free(uri);
	if (m == NULL) {
		fprintf(stderr, "stripedb ctl top: bad metadata address '%s'\n", ctx->metadata);
		rc = 2;
		goto out_curl;
	}
	signal(SIGINT, top_on_signal);
	signal(SIGTERM, top_on_signal);
	if (top_collect(ctx, m, dev, &prev) != 0) {
		rc = 1;
		goto out_client;
	}
	t_prev = sdb_mono_ms();
	for (;;) {
		uint64_t t;
		if (dev != NULL || !once) {
			for (int waited = 0; waited < interval && !top_stop; waited += 100) {
				struct timespec ts = {0, 100000000L};
				nanosleep(&ts, NULL);
			}
		}
		if (top_stop) {
			break;
		}
		if (top_collect(ctx, m, dev, &v) != 0) {
			rc = 1;
			break;
		}
		t = sdb_mono_ms();
		top_rates(&v, &prev, (double)(t - t_prev) / 1000.0);
		if (!once) {
			printf("\033[H\033[J");
		}
		top_print(ctx, &v, json);
		fflush(stdout);
		if (once) {
			break;
		}
		prev = v;
		t_prev = t;
	}
out_client:
	mongoc_client_destroy(m);
out_curl:
	curl_global_cleanup();
out:
	if (dev != NULL) {
		dev_cluster_free(dev);
		free(dev);
	}
	return rc;
}
