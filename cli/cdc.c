/* `stripedb ctl cdc status|read`: the operator view of the CDC pipeline (issue #7).
 *
 *   stripedb ctl [--metadata=H:P,...] [--json] cdc status [--cdc=SPEC] [--archive=SPEC]
 *       per shard in metadata: the publisher lease holder, the published position (last ts
 *       and next offset of the shard's CDC log), the oplog head, the lag in seconds and in
 *       events (capped at 10000), the live log's and the archive's ranges.
 *   stripedb ctl cdc read SHARD [--cdc=SPEC] [--archive=SPEC] [--after=SECS:INC]
 *       [--follow-ms=N] [--max=N] [--format=bson|json]
 *       print the shard's events after the position (default: all) through the archive and
 *       the live log, deduped on ts: raw BSON oplog entries back to back (bson, default)
 *       or one Extended JSON line {offset, ts, entry} per event (json). Stops when no
 *       event came for --follow-ms (default 0: at the end of what is there), or after
 *       --max events. A position that exists nowhere is an error (exit 1).
 *
 * --archive=SPEC is file:DIR or s3://BUCKET/PREFIX; an s3 archive also takes
 * --s3-endpoint=URL, --s3-region=R and --s3-credentials-file=F (else the AWS_* environment).
 * --cdc, --archive and the --s3-* flags default to STRIPEDB_CDC, STRIPEDB_ARCHIVE,
 * STRIPEDB_S3_ENDPOINT, STRIPEDB_S3_REGION and STRIPEDB_S3_CREDENTIALS_FILE. Exit codes: 0 ok, 1 an
 * error from the cluster or the log, 2 bad usage.
 */
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cdc/archive.h"
#include "cdc/log.h"
#include "cdc/reader.h"
#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/metauri.h"


int cli_cdc_main(struct cli_ctx *ctx, int argc, char **argv);

typedef struct cdc_opts {
	const char *cdc, *archive, *after, *format;
	const char *s3_endpoint, *s3_region, *s3_credentials_file;
	long follow_ms, max;
	const char *pos[2];
	int npos;
} cdc_opts;

static int usage(const char *msg)
{
	fprintf(stderr, "stripedb ctl cdc: %s (usage: cdc status [--cdc=SPEC] [--archive=SPEC]"
			" | cdc read SHARD [--after=SECS:INC] [--follow-ms=N] [--max=N] "
			"[--format=bson|json])\n",
		msg);
	return 2;
}

/* Parse argv of `ctl cdc` (after "cdc") into o: the archive options from the environment
 * (cli_archive_env), then the flags, up to two positionals. Returns: 0, or the exit code
 * 2 after one error line: a bad or unknown flag, too many arguments, no CDC log. */
static int parse(int argc, char **argv, cdc_opts *o)
{
	memset(o, 0, sizeof *o);
	cli_archive_env(&o->cdc, &o->archive, &o->s3_endpoint, &o->s3_region,
			&o->s3_credentials_file);
	o->format = "bson";
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		char *end;
		if (strncmp(a, "--cdc=", 6) == 0) {
			o->cdc = a + 6;
		} else if (strncmp(a, "--archive=", 10) == 0) {
			o->archive = a + 10;
		} else if (strncmp(a, "--s3-endpoint=", 14) == 0) {
			o->s3_endpoint = a + 14;
		} else if (strncmp(a, "--s3-region=", 12) == 0) {
			o->s3_region = a + 12;
		} else if (strncmp(a, "--s3-credentials-file=", 22) == 0) {
			o->s3_credentials_file = a + 22;
		} else if (strncmp(a, "--after=", 8) == 0) {
			o->after = a + 8;
		} else if (strncmp(a, "--format=", 9) == 0) {
			o->format = a + 9;
			if (strcmp(o->format, "bson") && strcmp(o->format, "json"))
				return usage("--format must be bson or json");
		} else if (strncmp(a, "--follow-ms=", 12) == 0) {
			o->follow_ms = strtol(a + 12, &end, 10);
			if (*end || o->follow_ms < 0)
				return usage("--follow-ms: not a number");
		} else if (strncmp(a, "--max=", 6) == 0) {
			o->max = strtol(a + 6, &end, 10);
			if (*end || o->max < 0)
				return usage("--max: not a number");
		} else if (strncmp(a, "--", 2) == 0) {
			fprintf(stderr, "stripedb ctl cdc: unknown flag %s\n", a);
			return 2;
		} else if (o->npos < 2) {
			o->pos[o->npos++] = a;
		} else {
			return usage("too many arguments");
		}
	}
	if (o->cdc == NULL || o->cdc[0] == '\0')
		return usage("no CDC log: pass --cdc=embedded:DIR|kafka:BOOTSTRAP or set STRIPEDB_CDC");
	return 0;
}

static int open_log(const cdc_opts *o, cdc_log **log)
{
	char err[512];
	cdc_log_opts lo = {.archive = o->archive && o->archive[0] ? o->archive : NULL,
			   .s3_endpoint = o->s3_endpoint,
			   .s3_region = o->s3_region,
			   .s3_credentials_file = o->s3_credentials_file};
	int rc = cdc_log_open(o->cdc, &lo, log, err, sizeof err);
	if (rc) {
		fprintf(stderr, "stripedb ctl cdc: %s\n", err);
		return rc == SDB_EINVAL ? 2 : 1;
	}
	return 0;
}

static int parse_ts(const char *s, uint64_t *ts)
{
	char *end;
	unsigned long t = strtoul(s, &end, 10), i = 0;
	if (end == s)
		return -1;
	if (*end == ':') {
		const char *p = end + 1;
		i = strtoul(p, &end, 10);
		if (end == p)
			return -1;
	}
	if (*end || t > UINT32_MAX || i > UINT32_MAX)
		return -1;
	*ts = ((uint64_t)t << 32) | i;
	return 0;
}

/* ------------------------------------------------------------ read */

static int cmd_read(const cdc_opts *o)
{
	cdc_log *log;
	cdc_reader *r;
	cdc_event ev;
	char err[512];
	uint64_t after = 0;
	long n = 0;
	int rc;
	if (o->npos != 2)
		return usage("read takes one SHARD");
	if (o->after && parse_ts(o->after, &after) != 0)
		return usage("--after must be SECS or SECS:INC");
	if ((rc = open_log(o, &log)) != 0)
		return rc;
	rc = cdc_reader_open(log, o->pos[1], after, &r, err, sizeof err);
	if (rc) {
		fprintf(stderr, "stripedb ctl cdc read: %s\n", err);
		cdc_log_close(log);
		return 1;
	}
	while (o->max == 0 || n < o->max) {
		rc = cdc_reader_next(r, &ev, (int)o->follow_ms, err, sizeof err);
		if (rc <= 0)
			break;
		n++;
		if (strcmp(o->format, "bson") == 0) {
			fwrite(ev.data, 1, ev.len, stdout);
		} else {
			bson_t doc;
			char *j = NULL;
			if (bson_init_static(&doc, ev.data, ev.len))
				j = bson_as_canonical_extended_json(&doc, NULL);
			printf("{\"offset\": %" PRIu64 ", \"ts\": {\"t\": %u, \"i\": %u}, \"entry\": %s}\n",
			       ev.offset, (unsigned)(ev.ts >> 32), (unsigned)ev.ts, j ? j : "null");
			bson_free(j);
		}
	}
	fflush(stdout);
	if (rc < 0)
		fprintf(stderr, "stripedb ctl cdc read: %s\n", err);
	cdc_reader_close(r);
	cdc_log_close(log);
	return rc < 0 ? 1 : 0;
}

/* ------------------------------------------------------------ status */

static mongoc_client_t *client(const char *uri)
{
	mongoc_client_t *c = auth_cluster_client_new(uri);
	if (c)
		mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	return c;
}

static int first_batch(mongoc_client_t *c, bson_t *cmd, bson_iter_t *it, bson_t *reply)
{
	bson_iter_t arr;
	bson_error_t e;
	if (!mongoc_client_command_simple(c, "local", cmd, NULL, reply, &e))
		return -1;
	if (!bson_iter_init(&arr, reply) || !bson_iter_find_descendant(&arr, "cursor.firstBatch", &arr) ||
	    !BSON_ITER_HOLDS_ARRAY(&arr) || !bson_iter_recurse(&arr, it))
		return -1;
	return 0;
}

/* Oplog head ts and entries after `after` (capped at 10000): -1 when unreachable. */
static int shard_head(const char *uri, int timeout_ms, uint64_t after, uint64_t *head,
		      int64_t *lag)
{
	char *u = sdb_asprintf("%s%sserverSelectionTimeoutMS=%d&connectTimeoutMS=%d", uri,
			       strchr(uri, '?') ? "&" : (uri[strlen(uri) - 1] == '/' ? "?" : "/?"),
			       timeout_ms, timeout_ms);
	mongoc_client_t *c = client(u);
	bson_t cmd = BSON_INITIALIZER, reply, s, f, g;
	bson_iter_t it;
	int rc = -1;
	free(u);
	*head = 0;
	*lag = -1;
	if (c == NULL)
		return -1;
	BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "sort", &s);
	BSON_APPEND_INT32(&s, "$natural", -1);
	bson_append_document_end(&cmd, &s);
	BSON_APPEND_INT32(&cmd, "limit", 1);
	BSON_APPEND_BOOL(&cmd, "singleBatch", true);
	if (first_batch(c, &cmd, &it, &reply) == 0) {
		rc = 0;
		if (bson_iter_next(&it) && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_t d;
			uint32_t t, i;
			if (bson_iter_recurse(&it, &d) && bson_iter_find(&d, "ts") &&
			    BSON_ITER_HOLDS_TIMESTAMP(&d)) {
				bson_iter_timestamp(&d, &t, &i);
				*head = ((uint64_t)t << 32) | i;
			}
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
	if (rc == 0 && *head <= after) {
		*lag = 0;
	} else if (rc == 0) {
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "find", "oplog.rs");
		BSON_APPEND_DOCUMENT_BEGIN(&cmd, "filter", &f);
		BSON_APPEND_DOCUMENT_BEGIN(&f, "ts", &g);
		BSON_APPEND_TIMESTAMP(&g, "$gt", (uint32_t)(after >> 32), (uint32_t)after);
		bson_append_document_end(&f, &g);
		bson_append_document_end(&cmd, &f);
		BSON_APPEND_INT32(&cmd, "limit", 10000);
		BSON_APPEND_INT32(&cmd, "batchSize", 10000);
		BSON_APPEND_BOOL(&cmd, "singleBatch", true);
		if (first_batch(c, &cmd, &it, &reply) == 0) {
			*lag = 0;
			while (bson_iter_next(&it))
				(*lag)++;
		}
		bson_destroy(&reply);
		bson_destroy(&cmd);
	}
	mongoc_client_destroy(c);
	return rc;
}

static void ts_json(char *buf, size_t n, uint64_t ts)
{
	snprintf(buf, n, "{\"t\": %u, \"i\": %u}", (unsigned)(ts >> 32), (unsigned)ts);
}

static int cmd_status(struct cli_ctx *ctx, const cdc_opts *o)
{
	cdc_log *log;
	mongoc_client_t *meta;
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	bson_iter_t it, arr;
	int rc, failures = 0, first = 1;
	if (o->npos != 1)
		return usage("status takes no argument");
	if ((rc = open_log(o, &log)) != 0)
		return rc;
	char *uri = sdb_meta_uri(ctx->metadata, false, ctx->timeout_ms, ctx->timeout_ms, 0);
	meta = client(uri);
	free(uri);
	if (meta == NULL) {
		cdc_log_close(log);
		fprintf(stderr, "stripedb ctl cdc: bad --metadata '%s'\n", ctx->metadata);
		return 2;
	}
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	if (!mongoc_client_command_simple(meta, "admin", &cmd, NULL, &reply, &e)) {
		fprintf(stderr, "stripedb ctl cdc status: listShards: %s\n", e.message);
		bson_destroy(&reply);
		bson_destroy(&cmd);
		mongoc_client_destroy(meta);
		cdc_log_close(log);
		return 1;
	}
	if (ctx->json)
		printf("{\"backend\": \"%s\", \"shards\": [", cdc_log_backend(log));
	else
		printf("%-12s %-34s %-16s %8s %8s %8s %-13s %-13s\n", "SHARD", "PUBLISHER", "PUBLISHED",
		       "OFFSET", "LAG_S", "LAG_EV", "LOG", "ARCHIVE");
	if (bson_iter_init_find(&it, &reply, "shards") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			bson_iter_t f;
			const char *id = NULL, *suri = NULL;
			char holder[200] = "-", err[512];
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &f))
				continue;
			while (bson_iter_next(&f)) {
				if (strcmp(bson_iter_key(&f), "id") == 0 && BSON_ITER_HOLDS_UTF8(&f))
					id = bson_iter_utf8(&f, NULL);
				else if (strcmp(bson_iter_key(&f), "uri") == 0 && BSON_ITER_HOLDS_UTF8(&f))
					suri = bson_iter_utf8(&f, NULL);
			}
			if (id == NULL || suri == NULL)
				continue;
			bson_t lc = BSON_INITIALIZER, lr;
			char *lname = sdb_asprintf("cdc/%s", id);
			BSON_APPEND_UTF8(&lc, "getLease", lname);
			free(lname);
			if (mongoc_client_command_simple(meta, "admin", &lc, NULL, &lr, &e)) {
				bson_iter_t h;
				if (bson_iter_init(&h, &lr) && bson_iter_find_descendant(&h, "lease.holder", &h) &&
				    BSON_ITER_HOLDS_UTF8(&h))
					snprintf(holder, sizeof holder, "%s", bson_iter_utf8(&h, NULL));
			}
			bson_destroy(&lr);
			bson_destroy(&lc);
			cdc_range live = {0}, ar = {0};
			int lrc = cdc_log_range(log, id, &live, err, sizeof err);
			if (lrc == 0 && cdc_log_archive(log))
				lrc = cdc_archive_range(cdc_log_archive(log), id, &ar, err, sizeof err);
			if (lrc) {
				fprintf(stderr, "stripedb ctl cdc status: %s: %s\n", id, err);
				failures++;
			}
			uint64_t pub = live.last_ts ? live.last_ts : ar.last_ts, head = 0;
			int64_t lag_ev = -1;
			int reach = shard_head(suri, ctx->timeout_ms, pub, &head, &lag_ev);
			int64_t lag_s = reach == 0 && head > pub ? (int64_t)(head >> 32) - (int64_t)(pub >> 32)
								 : 0;
			if (ctx->json) {
				char p[64], h[64], a1[64], a2[64], l1[64];
				ts_json(p, sizeof p, pub);
				ts_json(h, sizeof h, head);
				ts_json(l1, sizeof l1, live.first_ts);
				ts_json(a1, sizeof a1, ar.first_ts);
				ts_json(a2, sizeof a2, ar.last_ts);
				printf("%s{\"shard\": \"%s\", \"publisher\": \"%s\", \"publishedTs\": %s, "
				       "\"nextOffset\": %" PRIu64 ", \"headTs\": %s, \"shardReachable\": %s, "
				       "\"lagSeconds\": %" PRId64 ", \"lagEvents\": %" PRId64 ", "
				       "\"log\": {\"firstOffset\": %" PRIu64 ", \"nextOffset\": %" PRIu64
				       ", \"firstTs\": %s}, \"archive\": {\"firstOffset\": %" PRIu64
				       ", \"nextOffset\": %" PRIu64 ", \"firstTs\": %s, \"lastTs\": %s}}",
				       first ? "" : ", ", id, holder, p, live.next_offset, h,
				       reach == 0 ? "true" : "false", lag_s, lag_ev, live.first_offset,
				       live.next_offset, l1, ar.first_offset, ar.next_offset, a1, a2);
			} else {
				char p[32], lr2[32], ar2[32], lev[24];
				snprintf(p, sizeof p, "%u:%u", (unsigned)(pub >> 32), (unsigned)pub);
				snprintf(lr2, sizeof lr2, "%" PRIu64 "..%" PRIu64, live.first_offset,
					 live.next_offset);
				snprintf(ar2, sizeof ar2, "%" PRIu64 "..%" PRIu64, ar.first_offset,
					 ar.next_offset);
				if (reach == 0 && lag_ev >= 0)
					snprintf(lev, sizeof lev, "%" PRId64, lag_ev);
				else
					snprintf(lev, sizeof lev, "?");
				printf("%-12s %-34s %-16s %8" PRIu64 " %8" PRId64 " %8s %-13s %-13s\n", id,
				       holder, p, live.next_offset, lag_s, lev, lr2,
				       cdc_log_archive(log) ? ar2 : "-");
			}
			first = 0;
		}
	}
	if (ctx->json)
		printf("]}\n");
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(meta);
	cdc_log_close(log);
	return failures ? 1 : 0;
}

int cli_cdc_main(struct cli_ctx *ctx, int argc, char **argv)
{
	cdc_opts o;
	int rc;
	if (argc < 1)
		return usage("missing subcommand");
	rc = parse(argc, argv, &o);
	if (rc)
		return rc;
	if (o.npos == 0)
		return usage("missing subcommand");
	if (strcmp(o.pos[0], "status") == 0)
		return cmd_status(ctx, &o);
	if (strcmp(o.pos[0], "read") == 0)
		return cmd_read(&o);
	return usage("unknown subcommand");
}
