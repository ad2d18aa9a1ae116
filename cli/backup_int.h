/* Shared by `stripedb ctl backup` (cli/backup.c) and `stripedb ctl restore` (cli/restore.c),
 * issue #22: flags, usage, times, progress on stderr, the shards of metadata and the
 * backups' manifests. Design: src/cdc/README.md "Backups and point-in-time restore". */
#ifndef SDB_CLI_BACKUP_INT_H
#define SDB_CLI_BACKUP_INT_H

#include <bson/bson.h>
#include <stddef.h>
#include <stdint.h>

#include "cdc/archive.h"
#include "cdc/log.h"
#include "cli/cli.h"
#include "common/shardref.h"

/* Documents per batch: snapshot reads, bulk writes of a restore, progress updates. */
#define BATCH 1000

/* The flags of `ctl backup` and `ctl restore` (bk_parse): strings borrowed from argv or
 * the environment (STRIPEDB_CDC, STRIPEDB_ARCHIVE, STRIPEDB_S3_*, STRIPEDB_URI); pos: the
 * positional arguments (subcommand, ID or DB.COLL). */
typedef struct bk_opts {
	const char *cdc, *archive, *s3_endpoint, *s3_region, *s3_credentials_file;
	const char *shard, *to_time, *into, *uri, *to_shard, *import_latency;
	int all, dry_run, progress;
	const char *pos[3];
	int npos;
} bk_opts;

/* Progress on stderr: mode 1 a bar rewritten with \r (stderr is a terminal, no --json),
 * mode 2 one line per update (--progress, also with --json), 0 none. An update is shown
 * when its whole percent changed or a second passed (bar: 100 ms), and always at the end:
 *   <head> <pct>% <rate> docs/s ETA <eta><tail>
 * the bar (mode 1) starts with [####......] (20 wide, one # per 5%) and ends with ESC[K.
 * pct: done of total (below 100 until the end, 100 at the end); rate: work per second
 * since progress_start; ETA: (total - done) / rate as 12s, 3m05s or 1h02m, "--" while
 * unknown (no rate yet, or done past an estimated total). */
typedef struct progress {
	int mode, drawn, last_pct;
	int64_t t0_ms, last_ms;
} progress;

/* A shard of metadata: id and MongoDB URI (common/shardref.h). */
typedef sdb_shard_ref shard_ref;

/* A committed backup: shard, id, the manifest's archive key, and (loaded) its document. */
typedef struct manifest {
	char *shard, *id, *key;
	bson_t *doc;
} manifest;

/* Print the usage of `ctl who` after msg on stderr (one line). Returns: 2 (the exit
 * code). */
int bk_usage(const char *who, const char *msg);

/* Parse argv of `ctl who` into o (defaults from the environment). Returns: 0, or the exit
 * code 2 after a usage line for an unknown flag, too many arguments or no archive. */
int bk_parse(const char *who, int argc, char **argv, bk_opts *o);

/* The CDC log options of o (archive, S3 endpoint, region, credentials file). */
cdc_log_opts bk_log_opts(const bk_opts *o);

/* Format epoch ms as "YYYY-MM-DDTHH:MM:SS.mmmZ" into buf (>= 25 bytes). */
void bk_fmt_ms(int64_t ms, char *buf, size_t n);

/* Parse a time: "YYYY-MM-DDTHH:MM:SS[.mmm]Z" (UTC, the Z required) or epoch seconds[.mmm]
 * into epoch ms.
 * Returns: 0, or -1 when it is neither. */
int bk_parse_time(const char *s, int64_t *ms);

/* Progress (see struct progress): mode from flag (--progress), ctx->json and whether stderr
 * is a terminal. */
void bk_progress_init(progress *p, const cli_ctx *ctx, int flag);
/* A new subject (a shard's backup, a restore): the rate counts from now. */
void bk_progress_start(progress *p);
/* End the bar's line (before other output, or at the end). */
void bk_progress_break(progress *p);
/* Show "<fmt...> <pct>% <rate> docs/s ETA <eta><tail>" for done of total (work: what the
 * rate counts; final: the last update, 100%). */
void bk_progress_show(progress *p, int64_t done, int64_t total, int64_t work, int final,
		      const char *tail, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* The shards registered in metadata (listShards) into a heap array (sdb_shard_refs_free).
 * Returns: the exit code, 0, or 1 after one line on stderr. */
int bk_list_shards(const cli_ctx *ctx, shard_ref **out, size_t *n);

/* Parse the Extended JSON file path into a heap *doc. Errors: SDB_EIO (cannot open),
 * SDB_ECORRUPT (not Extended JSON), with err. */
int bk_load_json(const char *path, bson_t **doc, char *err, size_t errlen);

/* Free n manifests and the array. */
void bk_manifests_free(manifest *m, size_t n);

/* The committed backups (those with a manifest) of shard (NULL: all), oldest first per
 * shard, into a heap array; with load, the manifests are downloaded (through tmp, a
 * private directory) and parsed. Errors: the archive's (listing, download), or
 * bk_load_json's for a manifest, with err. */
int bk_list_manifests(cdc_archive *a, const char *shard, int load, const char *tmp,
		      manifest **out, size_t *n, char *err, size_t errlen);

#endif
