/* `stripedb ctl backup create|list|delete` and `stripedb ctl restore` (issue #22): consistent
 * snapshots of the shards kept in the CDC archive store, and point-in-time restore of a
 * collection from a backup plus the CDC events after it. Design and format in
 * src/cdc/README.md ("Backups and point-in-time restore").
 *
 *   ctl backup create [--shard=ID | --all] [--archive=SPEC] [--s3-*]
 *       [--import-latency-ms=N] [--progress]
 *   ctl backup list [--shard=ID]
 *   ctl backup delete ID [--shard=ID]
 *   ctl restore DB.COLL --to-time=TIME --cdc=SPEC --archive=SPEC
 *       (--uri=MONGODB_URI | --to-shard=ID) [--into=DB.OTHER] [--shard=ID] [--dry-run]
 *       [--progress]
 *   ctl restore --shard=ID --to-time=TIME --cdc=SPEC --archive=SPEC
 *       (--uri=MONGODB_URI | --to-shard=ID) [--dry-run] [--progress]   a whole shard
 *
 * ctl itself runs a backup (no server-side job): per shard it reads every collection with
 * the shard's point-in-time read (stripedbSnapshot, the Data Movement Platform's snapshot
 * import, which returns the snapshot's oplog position atOplogTs), streams the documents in
 * batches of 1000 into a temporary BSON file (memory: one batch) while hashing them, uploads
 * the file to the archive (S3: multipart beyond 8 MiB), deletes it, and at the end uploads
 * the shard's manifest, the commit point of the backup:
 *   backups/<shard>/<id>/manifest.json   {id, shard, startedAt, headTs, headWall,
 *                                         collections: [{ns, object, atOplogTs, atWall,
 *                                         count, bytes, sha256, ownedOnly, ...}]}
 *   backups/<shard>/<id>/data-NNNNN.bson documents back to back (mongodump's format)
 * Each collection is its own snapshot (its own atOplogTs); a collection missing from a
 * manifest was empty at headTs (read before the collections were listed). The reads are
 * paced by the migration's import throttle (common/throttle.h, --import-latency-ms).
 *
 * Progress (stderr; struct progress in cli/backup_int.h): a bar rewritten with \r when stderr is a
 * terminal and --json is not given, one line per update with --progress.
 *
 * `ctl restore` is cli/restore.c; what both share is cli/backup_int.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <mongoc/mongoc.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "auth/cluster.h"
#include "cdc/archive.h"
#include "cdc/backup.h"
#include "cdc/log.h"
#include "cdc/reader.h"
#include "cli/backup_int.h"
#include "cli/cli.h"
#include "common/alloc.h"
#include "common/shardref.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/throttle.h"

int cli_backup_main(cli_ctx *ctx, int argc, char **argv);


int bk_usage(const char *who, const char *msg)
{
	fprintf(stderr,
		"stripedb ctl %s: %s (usage: backup create [--shard=ID|--all] "
		"[--import-latency-ms=N] [--progress] | backup list [--shard=ID] | backup delete "
		"ID [--shard=ID] | restore DB.COLL --to-time=TIME --uri=URI|--to-shard=ID "
		"[--into=DB.OTHER] [--shard=ID] [--dry-run] [--progress] | restore --shard=ID "
		"--to-time=TIME --uri=URI|--to-shard=ID [--dry-run] [--progress]; with "
		"--archive=SPEC, and --cdc=SPEC for restore)\n",
		who, msg);
	return 2;
}

int bk_parse(const char *who, int argc, char **argv, bk_opts *o)
{
	memset(o, 0, sizeof *o);
	cli_archive_env(&o->cdc, &o->archive, &o->s3_endpoint, &o->s3_region,
			&o->s3_credentials_file);
	o->uri = getenv("STRIPEDB_URI");
	static const struct {
		const char *flag;
		size_t off;
	} flags[] = {
		{"--cdc=", offsetof(bk_opts, cdc)},
		{"--archive=", offsetof(bk_opts, archive)},
		{"--s3-endpoint=", offsetof(bk_opts, s3_endpoint)},
		{"--s3-region=", offsetof(bk_opts, s3_region)},
		{"--s3-credentials-file=", offsetof(bk_opts, s3_credentials_file)},
		{"--shard=", offsetof(bk_opts, shard)},
		{"--to-time=", offsetof(bk_opts, to_time)},
		{"--into=", offsetof(bk_opts, into)},
		{"--uri=", offsetof(bk_opts, uri)},
		{"--to-shard=", offsetof(bk_opts, to_shard)},
		{"--import-latency-ms=", offsetof(bk_opts, import_latency)},
	};
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		int done = 0;
		for (size_t f = 0; f < sizeof flags / sizeof flags[0] && !done; f++) {
			size_t l = strlen(flags[f].flag);
			if (strncmp(a, flags[f].flag, l) == 0) {
				*(const char **)((char *)o + flags[f].off) = a + l;
				done = 1;
			} else if (strncmp(a, flags[f].flag, l - 1) == 0 && a[l - 1] == '\0' &&
				   i + 1 < argc) {
				*(const char **)((char *)o + flags[f].off) = argv[++i];
				done = 1;
			}
		}
		if (done)
			continue;
		if (strcmp(a, "--all") == 0) {
			o->all = 1;
		} else if (strcmp(a, "--dry-run") == 0) {
			o->dry_run = 1;
		} else if (strcmp(a, "--progress") == 0) {
			o->progress = 1;
		} else if (strncmp(a, "--", 2) == 0) {
			fprintf(stderr, "stripedb ctl %s: unknown flag %s\n", who, a);
			return 2;
		} else if (o->npos < 3) {
			o->pos[o->npos++] = a;
		} else {
			return bk_usage(who, "too many arguments");
		}
	}
	if (o->archive == NULL || o->archive[0] == '\0')
		return bk_usage(who, "no archive: pass --archive=file:DIR|s3://BUCKET/PREFIX or set "
				  "STRIPEDB_ARCHIVE");
	return 0;
}

cdc_log_opts bk_log_opts(const bk_opts *o)
{
	cdc_log_opts lo = {.archive = o->archive,
			   .s3_endpoint = o->s3_endpoint,
			   .s3_region = o->s3_region,
			   .s3_credentials_file = o->s3_credentials_file};
	return lo;
}

/* ------------------------------------------------------------ small helpers */


void bk_fmt_ms(int64_t ms, char *buf, size_t n)
{
	time_t s = (time_t)(ms / 1000);
	struct tm tm;
	gmtime_r(&s, &tm);
	size_t l = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + l, n - l, ".%03dZ", (int)(ms % 1000));
}

/* "2026-12-02T05:13:00[.123]Z" or epoch seconds "1796001491[.123]" -> epoch ms. */
int bk_parse_time(const char *s, int64_t *ms)
{
	char *end;
	struct tm tm;
	memset(&tm, 0, sizeof tm);
	const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
	int64_t frac = 0;
	bool iso = p != NULL;
	if (p) {
		*ms = (int64_t)timegm(&tm) * 1000;
	} else {
		long long v = strtoll(s, &end, 10);
		if (end == s || v < 0)
			return -1;
		*ms = (int64_t)v * 1000;
		p = end;
	}
	if (*p == '.') {
		int digits = 0;
		for (p++; *p >= '0' && *p <= '9'; p++, digits++)
			if (digits < 3)
				frac = frac * 10 + (*p - '0');
		if (digits == 0)
			return -1;
		while (digits++ < 3)
			frac *= 10;
	}
	if (iso && *p++ != 'Z') /* UTC said explicitly: a time without a zone is ambiguous */
		return -1;
	if (*p)
		return -1;
	*ms += frac;
	return 0;
}

/* ------------------------------------------------------------ progress (stderr) */


void bk_progress_init(progress *p, const cli_ctx *ctx, int flag)
{
	memset(p, 0, sizeof *p);
	p->mode = flag ? 2 : (!ctx->json && isatty(2)) ? 1 : 0;
}

/* A new subject (a shard's backup, a restore): the rate counts from now. */
void bk_progress_start(progress *p)
{
	p->t0_ms = (int64_t)sdb_mono_ms();
	p->last_ms = 0;
	p->last_pct = -1;
}

/* End the bar's line (before other output, or at the end). */
void bk_progress_break(progress *p)
{
	if (p->drawn)
		fputc('\n', stderr);
	p->drawn = 0;
}

void bk_progress_show(progress *p, int64_t done, int64_t total, int64_t work, int final,
			  const char *tail, const char *fmt, ...)
{
	if (p->mode == 0)
		return;
	int64_t now = (int64_t)sdb_mono_ms(), el = now - p->t0_ms;
	int pct = final ? 100 : total > 0 ? (int)(done >= total ? 99 : done * 100 / total) : 0;
	if (!final && pct == p->last_pct && now - p->last_ms < (p->mode == 1 ? 100 : 1000))
		return;
	p->last_pct = pct;
	p->last_ms = now;
	double rate = el > 0 ? (double)work * 1000.0 / (double)el : 0;
	char eta[32] = "--";
	if (final) {
		snprintf(eta, sizeof eta, "0s");
	} else if (rate > 0 && total > done) {
		int64_t s = (int64_t)((double)(total - done) / rate + 0.5);
		if (s < 60)
			snprintf(eta, sizeof eta, "%" PRId64 "s", s);
		else if (s < 3600)
			snprintf(eta, sizeof eta, "%" PRId64 "m%02ds", s / 60, (int)(s % 60));
		else
			snprintf(eta, sizeof eta, "%" PRId64 "h%02dm", s / 3600, (int)(s % 3600 / 60));
	}
	va_list ap;
	va_start(ap, fmt);
	if (p->mode == 1)
		fprintf(stderr, "\r[%.*s%.*s] ", pct / 5, "####################", 20 - pct / 5,
			"....................");
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " %d%% %.0f docs/s ETA %s%s", pct, rate, eta, tail ? tail : "");
	if (p->mode == 1) {
		fputs("\033[K", stderr);
		p->drawn = 1;
		if (final)
			bk_progress_break(p);
	} else {
		fputc('\n', stderr);
	}
	fflush(stderr);
}


/* The shards registered in metadata (listShards). Returns the exit code. */
int bk_list_shards(const cli_ctx *ctx, shard_ref **out, size_t *n)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	BSON_APPEND_INT32(&cmd, "listShards", 1);
	int rc = cli_meta_run(ctx, &cmd, &reply);
	bson_destroy(&cmd);
	*out = NULL;
	*n = 0;
	if (rc == 0)
		sdb_shard_refs_parse(&reply, out, n);
	bson_destroy(&reply);
	return rc;
}





/* ------------------------------------------------------------ backup create */







/* Parse the Extended JSON file at path into *doc (heap). */
int bk_load_json(const char *path, bson_t **doc, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t n = 0;
	int rc = 0;
	if (f == NULL)
		return sdb_errf(err, errlen, SDB_EIO, "open %s: %s", path, strerror(errno));
	FILE *mem = open_memstream(&buf, &n);
	char chunk[8192];
	size_t r;
	while ((r = fread(chunk, 1, sizeof chunk, f)) > 0)
		fwrite(chunk, 1, r, mem);
	fclose(f);
	fclose(mem);
	bson_error_t e;
	*doc = bson_new_from_json((const uint8_t *)buf, (ssize_t)n, &e);
	if (*doc == NULL)
		rc = sdb_errf(err, errlen, SDB_ECORRUPT, "bad manifest: %s", e.message);
	free(buf);
	return rc;
}


static int open_archive(const char *who, const bk_opts *o, cdc_archive **a)
{
	char err[1024];
	cdc_log_opts lo = bk_log_opts(o);
	/* an unreachable s3 endpoint is only a warning at open (the coordinator starts
	 * anyway); here the first request fails with the one error line */
	sdb_log_set_level(SDB_LOG_ERROR);
	int rc = cdc_archive_open(o->archive, &lo, a, err, sizeof err);
	if (rc) {
		fprintf(stderr, "stripedb ctl %s: %s\n", who, err);
		return rc == SDB_EINVAL ? 2 : 1;
	}
	return 0;
}

/* A shard's backup progress (cdc_backup_opts.progress). */
typedef struct create_pg {
	progress pg;
	const char *id;
} create_pg;

static void create_progress(const cdc_backup_progress *bp, void *arg)
{
	create_pg *c = arg;
	char tail[64];
	snprintf(tail, sizeof tail, " throttled %" PRId64 " ms", bp->throttled_ms);
	bk_progress_show(&c->pg, bp->done, bp->expected, bp->done, bp->finished, tail,
		      "backup %s %s: %" PRId64 "/~%" PRId64 " documents", c->id, bp->shard,
		      bp->done, bp->expected);
}

static int cmd_create(cli_ctx *ctx, const bk_opts *o)
{
	cdc_archive *a;
	shard_ref *shards;
	size_t n;
	char err[1024], id[40];
	int rc, done = 0;
	create_pg cp;
	cdc_backup_opts bo = {.timeout_ms = ctx->timeout_ms,
			      .import_latency_ms = SDB_IMPORT_LATENCY_MS,
			      .progress = create_progress,
			      .arg = &cp};
	if (o->npos != 1)
		return bk_usage("backup", "create takes no argument");
	if (!o->all && o->shard == NULL)
		return bk_usage("backup", "create needs --shard=ID or --all");
	if (o->import_latency) {
		char *end;
		long long v = strtoll(o->import_latency, &end, 10);
		if (end == o->import_latency || *end || v < 0 || v > 3600000)
			return bk_usage("backup", "--import-latency-ms takes an integer 0..3600000 (0: "
					       "no throttle)");
		bo.import_latency_ms = v;
	}
	bk_progress_init(&cp.pg, ctx, o->progress);
	cp.id = id;
	if ((rc = open_archive("backup", o, &a)) != 0)
		return rc;
	if ((rc = bk_list_shards(ctx, &shards, &n)) != 0) {
		cdc_archive_close(a);
		return rc;
	}
	cdc_backup_id(sdb_wall_ms(), id, sizeof id);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		cdc_backup_stats st;
		if (!o->all && strcmp(shards[i].id, o->shard) != 0)
			continue;
		done++;
		bk_progress_start(&cp.pg);
		rc = cdc_backup_shard_opts(a, shards[i].id, shards[i].uri, id, &bo, &st, err,
					   sizeof err);
		bk_progress_break(&cp.pg);
		if (rc != 0) {
			fprintf(stderr, "stripedb ctl backup: %s\n", err);
			rc = 1;
		} else if (ctx->json) {
			printf("{\"id\": \"%s\", \"shard\": \"%s\", \"collections\": %d, "
			       "\"documents\": %" PRId64 ", \"bytes\": %" PRId64
			       ", \"throttledMS\": %" PRId64 "}\n",
			       id, shards[i].id, st.collections, st.documents, st.bytes,
			       st.throttled_ms);
		} else {
			printf("backup %s of %s: %d collections, %" PRId64 " documents, %" PRId64
			       " bytes, throttled %" PRId64 " ms\n",
			       id, shards[i].id, st.collections, st.documents, st.bytes,
			       st.throttled_ms);
		}
		fflush(stdout);
	}
	if (rc == 0 && done == 0) {
		fprintf(stderr, "stripedb ctl backup: no shard %s in metadata\n",
			o->shard ? o->shard : "");
		rc = 1;
	}
	sdb_shard_refs_free(shards, n);
	cdc_archive_close(a);
	return rc;
}

/* ------------------------------------------------------------ list / manifests */


void bk_manifests_free(manifest *m, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(m[i].shard);
		free(m[i].id);
		free(m[i].key);
		if (m[i].doc)
			bson_destroy(m[i].doc);
	}
	free(m);
}

/* The committed backups (those with a manifest) of shard (NULL: all), oldest first per
 * shard; with load, the manifests are downloaded and parsed. */
int bk_list_manifests(cdc_archive *a, const char *shard, int load, const char *tmp,
		      manifest **out, size_t *n, char *err, size_t errlen)
{
	cdc_backup_ent *ents = NULL;
	size_t ne = 0;
	int rc = cdc_backup_scan(a, shard, &ents, &ne, err, errlen);
	*out = NULL;
	*n = 0;
	for (size_t i = 0; rc == 0 && i < ne; i++) {
		if (!ents[i].committed)
			continue;
		manifest m = {.shard = sdb_strdup(ents[i].shard), .id = sdb_strdup(ents[i].id),
			      .key = sdb_asprintf("backups/%s/%s/manifest.json", ents[i].shard,
						  ents[i].id)};
		if (load) {
			char *path = sdb_asprintf("%s/m.json", tmp);
			rc = cdc_archive_obj_get(a, m.key, path, err, errlen);
			if (rc == 0) {
				rc = bk_load_json(path, &m.doc, err, errlen);
				if (rc)
					sdb_errwrap(err, errlen, rc, "%s", m.key);
			}
			unlink(path);
			free(path);
		}
		*out = sdb_realloc(*out, (*n + 1) * sizeof **out);
		(*out)[(*n)++] = m;
	}
	cdc_backup_ents_free(ents, ne);
	if (rc) {
		bk_manifests_free(*out, *n);
		*out = NULL;
		*n = 0;
	}
	return rc;
}

/* The manifest of shard/id among m[0..n), NULL when none. */
static const manifest *find_manifest(const manifest *m, size_t n, const char *shard,
				     const char *id)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(m[i].shard, shard) == 0 && strcmp(m[i].id, id) == 0)
			return &m[i];
	return NULL;
}

/* Every backup, committed or incomplete (data objects without a manifest: being written,
 * or left by a writer that died; the coordinator deletes it once certainly dead, see
 * cdc_backup_sweep), with a state. */
static int cmd_list(cli_ctx *ctx, const bk_opts *o)
{
	cdc_archive *a;
	manifest *m = NULL;
	cdc_backup_ent *e = NULL;
	size_t n = 0, ne = 0;
	char err[1024];
	int rc;
	if (o->npos != 1)
		return bk_usage("backup", "list takes no argument");
	if ((rc = open_archive("backup", o, &a)) != 0)
		return rc;
	char *tmp = cdc_backup_tmpdir();
	rc = cdc_backup_scan(a, o->shard, &e, &ne, err, sizeof err);
	if (rc == 0)
		rc = bk_list_manifests(a, o->shard, 1, tmp ? tmp : "/tmp", &m, &n, err, sizeof err);
	if (tmp) {
		rmdir(tmp);
		free(tmp);
	}
	if (rc) {
		fprintf(stderr, "stripedb ctl backup list: %s\n", err);
		cdc_backup_ents_free(e, ne);
		cdc_archive_close(a);
		return 1;
	}
	if (ctx->json)
		printf("{\"backups\": [");
	else
		printf("%-22s %-12s %-24s %-16s %6s %10s %12s %s\n", "ID", "SHARD", "TIME",
		       "HEAD_TS", "COLLS", "DOCUMENTS", "BYTES", "STATE");
	for (size_t i = 0; i < ne; i++) {
		const manifest *mi = e[i].committed ? find_manifest(m, n, e[i].shard, e[i].id)
						    : NULL;
		if (mi == NULL) {
			/* incomplete (or its manifest appeared between the two listings) */
			if (ctx->json) {
				bson_t d = BSON_INITIALIZER, arr;
				BSON_APPEND_UTF8(&d, "id", e[i].id);
				BSON_APPEND_UTF8(&d, "shard", e[i].shard);
				BSON_APPEND_UTF8(&d, "state", "incomplete");
				BSON_APPEND_BOOL(&d, "incomplete", true);
				BSON_APPEND_INT32(&d, "objects", (int32_t)e[i].objects);
				BSON_APPEND_ARRAY_BEGIN(&d, "collections", &arr);
				bson_append_array_end(&d, &arr);
				char *j = bson_as_relaxed_extended_json(&d, NULL);
				printf("%s%s", i ? ", " : "", j);
				bson_free(j);
				bson_destroy(&d);
			} else
				printf("%-22s %-12s %-24s %-16s %6s %10s %12s incomplete (%zu "
				       "objects, no manifest)\n",
				       e[i].id, e[i].shard, "-", "-", "-", "-", "-", e[i].objects);
			continue;
		}
		char t[40];
		uint64_t h = cdc_bson_ts(mi->doc, "headTs");
		bson_iter_t it;
		uint32_t colls = 0;
		if (bson_iter_init_find(&it, mi->doc, "collections") && BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_t c;
			bson_iter_recurse(&it, &c);
			while (bson_iter_next(&c))
				colls++;
		}
		bk_fmt_ms(cdc_bson_i64(mi->doc, "headWall"), t, sizeof t);
		if (ctx->json) {
			bson_t *d = bson_copy(mi->doc);
			BSON_APPEND_UTF8(d, "state", "committed");
			BSON_APPEND_BOOL(d, "incomplete", false);
			char *j = bson_as_canonical_extended_json(d, NULL);
			printf("%s%s", i ? ", " : "", j);
			bson_free(j);
			bson_destroy(d);
		} else {
			char hs[32];
			snprintf(hs, sizeof hs, "%u:%u", (unsigned)(h >> 32), (unsigned)h);
			printf("%-22s %-12s %-24s %-16s %6u %10" PRId64 " %12" PRId64 " committed\n",
			       mi->id, mi->shard, t, hs, colls, cdc_bson_i64(mi->doc, "documents"),
			       cdc_bson_i64(mi->doc, "bytes"));
		}
	}
	if (ctx->json)
		printf("]}\n");
	bk_manifests_free(m, n);
	cdc_backup_ents_free(e, ne);
	cdc_archive_close(a);
	return 0;
}

/* Delete backup ID (of --shard, else of every shard that has one), committed or
 * incomplete (cdc_backup_delete: the manifest first). */
static int cmd_delete(cli_ctx *ctx, const bk_opts *o)
{
	cdc_archive *a;
	cdc_backup_ent *e;
	size_t n;
	char err[1024];
	int rc, found = 0;
	if (o->npos != 2)
		return bk_usage("backup", "delete takes one ID");
	if ((rc = open_archive("backup", o, &a)) != 0)
		return rc;
	rc = cdc_backup_scan(a, o->shard, &e, &n, err, sizeof err);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		size_t d;
		if (strcmp(e[i].id, o->pos[1]) != 0)
			continue;
		found++;
		rc = cdc_backup_delete(a, e[i].shard, e[i].id, &d, err, sizeof err);
		if (rc == 0 && !ctx->json)
			printf("deleted %sbackup %s of %s\n", e[i].committed ? "" : "incomplete ",
			       e[i].id, e[i].shard);
	}
	cdc_backup_ents_free(e, n);
	cdc_archive_close(a);
	if (rc) {
		fprintf(stderr, "stripedb ctl backup delete: %s\n", err);
		return 1;
	}
	if (!found) {
		fprintf(stderr, "stripedb ctl backup delete: no backup %s\n", o->pos[1]);
		return 1;
	}
	if (ctx->json)
		printf("{\"ok\": true, \"deleted\": %d}\n", found);
	return 0;
}

int cli_backup_main(cli_ctx *ctx, int argc, char **argv)
{
	bk_opts o;
	int rc = bk_parse("backup", argc, argv, &o);
	if (rc)
		return rc;
	if (o.npos == 0)
		return bk_usage("backup", "missing subcommand");
	if (o.to_time || o.into || o.dry_run || o.to_shard)
		return bk_usage("backup", "--to-time, --into, --to-shard and --dry-run are restore "
				       "flags");
	if ((o.all || o.import_latency || o.progress) && strcmp(o.pos[0], "create") != 0)
		return bk_usage("backup", "--all, --import-latency-ms and --progress are create flags");
	if (o.all && o.shard)
		return bk_usage("backup", "--all and --shard exclude each other: back up every "
					  "shard or one");
	if (strcmp(o.pos[0], "create") == 0)
		return cmd_create(ctx, &o);
	if (strcmp(o.pos[0], "list") == 0)
		return cmd_list(ctx, &o);
	if (strcmp(o.pos[0], "delete") == 0)
		return cmd_delete(ctx, &o);
	return bk_usage("backup", "unknown subcommand");
}
