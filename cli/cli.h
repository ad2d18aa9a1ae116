/* `stripedb ctl`: the operator CLI (DESIGN.md §3a).
 *
 * Talks to the metadata service with libmongoc. Exit codes: 0 success, 1 the cluster
 * answered with an error or could not be reached, 2 bad usage; errors are one line on
 * stderr. Every listing also prints as JSON with --json.
 */
#ifndef SDB_CLI_CLI_H
#define SDB_CLI_CLI_H

#include <bson/bson.h>

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

/* A `ctl` subcommand: argv starts after its name. Returns the exit code. */
typedef int (*cli_cmd_fn)(cli_ctx *ctx, int argc, char **argv);

/* Run `stripedb ctl ARGS...`; argv excludes "stripedb ctl". Returns: the exit code. */
int cli_main(int argc, char **argv);

/* Run `stripedb dev ARGS...` (a local cluster: up, status, down, kill, restart; see
 * cli/dev.c); argv excludes "stripedb dev". Returns: the exit code (0, 1 failure, 2
 * usage). */
int cli_dev_main(int argc, char **argv);

#endif
