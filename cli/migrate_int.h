/* The helpers cli/migrate.c shares with cli/migrate_plan.c (issue #17): the metadata calls,
 * the argument parser and the chunk table of the `stripedb ctl` migration subcommands.
 * Internal to cli/: not a library interface. */
#ifndef SDB_CLI_MIGRATE_INT_H
#define SDB_CLI_MIGRATE_INT_H

#include <bson/bson.h>
#include <mongoc/mongoc.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/cli.h"

/* The options every migration-registering subcommand shares (parse_common in migrate.c):
 * max_pause_ms (0: the coordinator's default), grace_ms (-1: default), order ("index",
 * "arrival", "id" or NULL), id (one migration's id or NULL: generated), group (the plan id stored
 * as "group" in every spec of a multi-chunk command, or NULL), wait, dry_run (flags). */
typedef struct mig_opts {
	int64_t max_pause_ms, grace_ms;
	const char *order, *id, *group;
	int wait, dry_run;
} mig_opts;

/* One option of a ctl subcommand for cmig_parse_args: a value option when val is set (taken
 * as "NAME VALUE" or "NAME=VALUE"; *val points into argv, the last one given wins), a flag
 * when flag is set (NAME alone sets *flag to 1). A table ends with {0}. */
typedef struct arg_opt {
	const char *name;
	const char **val;
	int *flag;
} arg_opt;

/* One chunk of the routing table: id, namespace, owning shard, bounds (heap copies). */
typedef struct chunk_row {
	int64_t id;
	char ns[256], shard[64];
	bson_t *min, *max;
} chunk_row;

/* Run cmd on metadata's admin database. reply is always initialised (caller destroys);
 * it holds the answer on success only. Returns: 0, the server's error code, or -1 (no
 * answer); the error line went to stderr. */
int cmig_run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply);

/* Field k of d as text into buf (n bytes; a string, or a number in decimal; "" when absent
 * or of another type). Returns: buf. */
const char *cmig_sval(const bson_t *d, const char *k, char *buf, size_t n);

/* Field k of d as an integer (any number type). Returns: it, or 0 when absent. */
int64_t cmig_ival(const bson_t *d, const char *k);

/* Field k of d (a document or array) as a static view into *out (valid while d is).
 * Returns: false when absent or of another type. */
bool cmig_sub(const bson_t *d, const char *k, bson_t *out);

/* ns's routing table (getRoutingTable by cursor) into *reply: {routingVersion, key, hashed,
 * chunks: [...]}; caller destroys reply whatever the result. Returns: 0 or cmig_run's
 * error. */
int cmig_routing(mongoc_client_t *c, const char *ns, bson_t *reply);

/* registerMigration of chunk of ns from -> to with o's options (o->group, when set, goes
 * into the spec as "group"); the id (o->id or a generated one) goes to idbuf (idlen
 * bytes). Returns: 0 or cmig_run's error. */
int cmig_register(mongoc_client_t *c, const char *ns, int64_t chunk, const char *from,
		  const char *to, const mig_opts *o, char *idbuf, size_t idlen);

/* Poll until every one of ids[0..n) is in a terminal state (a progress bar on a tty; the
 * status of each one that did not complete). Returns: 0 when all completed, else 1. */
int cmig_wait_all(struct cli_ctx *ctx, mongoc_client_t *c, char ids[][128], size_t n);

/* The one argument parser of the migration subcommands: argv[first..argc) matched against
 * opts (may be NULL), then the shared mig_opts options when o is set, then, when pos is set,
 * the first word not starting with '-' goes to *pos. Returns: 0, or 2 (bad usage) after
 * printing "stripedb ctl CMD: unexpected argument 'A'". */
int cmig_parse_args(const char *cmd, int argc, char **argv, int first, const arg_opt *opts,
		    mig_opts *o, const char **pos);

/* Abort migration id before its switch (-> aborted) or roll it back after it (->
 * rolling_back), as `ctl migration rollback` does; one line on stdout. Returns: 0, or 1
 * (not found, terminal already, or metadata refused; the line went to stderr). */
int cmig_rollback(mongoc_client_t *c, const char *id);

/* The chunks of ns ("all": every collection) into *out (a heap array; free with
 * cmig_free_chunks). Returns: their count, or (size_t)-1 when the routing table could not
 * be read. */
size_t cmig_load_chunks(mongoc_client_t *c, const char *ns, chunk_row **out);
void cmig_free_chunks(chunk_row *r, size_t n);

/* `ctl migrate` with --plan FILE|-, --chunks A,B,C or --filter JSON (cli/migrate_plan.c):
 * ns (NULL with --plan), to (NULL with --plan), exactly one of plan, chunks, filter set;
 * o the shared options already parsed. Validates the whole plan before registering
 * anything. Returns: the exit code, 0, 1 (cluster error, a registration failed and the
 * earlier ones were aborted, or --wait saw an end other than complete), 2 (a bad plan:
 * one line on stderr, nothing registered, nothing split). */
int cli_migrate_plan(struct cli_ctx *ctx, const char *ns, const char *to, const char *plan,
		     const char *chunks, const char *filter, const mig_opts *o);

#endif
