/* `stripedb ctl`: the operator CLI (DESIGN.md §3a).
 *
 * Talks to the metadata service with libmongoc. Exit codes: 0 success, 1 the cluster
 * answered with an error or could not be reached, 2 bad usage; errors are one line on
 * stderr. Every listing also prints as JSON with --json.
 */
#ifndef SDB_CLI_CLI_H
#define SDB_CLI_CLI_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/bsonget.h" /* sdb_bson_iter_doc, for the subcommands' replies */

/* Global options of `stripedb ctl`, parsed once by cli_main and passed to every
 * subcommand: the metadata members ("H:P,H:P"; from --metadata or STRIPEDB_METADATA),
 * --json output, and the per-request timeout in ms (--timeout-ms, default 5000). */
typedef struct cli_ctx {
	const char *metadata;
	int json;
	int timeout_ms;
} cli_ctx;

/* A client of the metadata replica set (ctx->metadata, ctx->timeout_ms for server
 * selection and connect), with the cluster key and internal TLS cli_main loaded, error API
 * v2. NULL after printing the one error line (no or bad address). Caller destroys it. */
struct _mongoc_client_t *cli_meta_client(const cli_ctx *ctx);

/* Run cmd on the admin database of the metadata leader (cli_meta_client). reply is
 * always initialised (caller destroys it): the leader's answer, or empty when none came.
 * Returns: the exit code, 0, or 1 after printing the one error line. */
int cli_meta_run(const cli_ctx *ctx, const bson_t *cmd, bson_t *reply);

/* cli_meta_run, then destroy cmd and, on success, print done (or {"ok": true} with
 * --json). Returns: the exit code, as cli_meta_run. */
int cli_meta_simple(const cli_ctx *ctx, bson_t *cmd, const char *done);

/* Whether d's field key is an array; if so, out is set to iterate its elements (call
 * bson_iter_next first; valid while d lives). Returns false when key is missing, not an
 * array, or does not parse. */
bool cli_iter_array(const bson_t *d, const char *key, bson_iter_t *out);

/* Print d on stdout as relaxed extended JSON, one line. */
void cli_print_json(const bson_t *d);

/* Parse s as a decimal member id, a whole number >= 0 with nothing after it, into *out.
 * Returns: 0, or -1 (nothing stored) when s is not one. */
int cli_parse_id(const char *s, long long *out);

/* A replica-set URI built into a caller's buffer: "mongodb://H:P[,H:P...]/?replicaSet=SET".
 * Use: cli_rs_uri_begin, cli_rs_uri_add per member (in order), cli_rs_uri_end. A URI that
 * does not fit is cut short (snprintf's truncation, always NUL-terminated; n > 0). */
typedef struct cli_rs_uri {
	char *buf;
	size_t n, len;
	int members;
} cli_rs_uri;

/* Start u in buf[n] with "mongodb://". */
void cli_rs_uri_begin(cli_rs_uri *u, char *buf, size_t n);

/* Append member host:port (comma-separated after the first). */
void cli_rs_uri_add(cli_rs_uri *u, const char *host, int port);

/* Append "/?replicaSet=SET". */
void cli_rs_uri_end(cli_rs_uri *u, const char *set);

/* The archive options `ctl backup|restore|cdc` read from the environment before their
 * flags: each of *cdc (STRIPEDB_CDC), *archive (STRIPEDB_ARCHIVE), *s3_endpoint
 * (STRIPEDB_S3_ENDPOINT), *s3_region (STRIPEDB_S3_REGION) and *s3_credentials_file
 * (STRIPEDB_S3_CREDENTIALS_FILE) is set to getenv's answer (NULL when unset; the
 * environment's storage, not copied). */
void cli_archive_env(const char **cdc, const char **archive, const char **s3_endpoint,
		     const char **s3_region, const char **s3_credentials_file);

/* A `ctl` subcommand: argv starts after its name. Returns the exit code. */
typedef int (*cli_cmd_fn)(cli_ctx *ctx, int argc, char **argv);

/* Run `stripedb ctl ARGS...`; argv excludes "stripedb ctl". Returns: the exit code. */
int cli_main(int argc, char **argv);

/* Run `stripedb dev ARGS...` (a local cluster: up, status, down, kill, restart; see
 * cli/dev.c); argv excludes "stripedb dev". Returns: the exit code (0, 1 failure, 2
 * usage). */
int cli_dev_main(int argc, char **argv);

#endif
