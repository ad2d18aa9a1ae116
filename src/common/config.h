/* Configuration: command-line flags, then STRIPEDB_* environment variables, then a
 * config file (INI, parsed with inih), in that order of precedence.
 *
 * Every option is declared once in SDB_OPTIONS below (name, kind, default, help); the
 * flag is --NAME=VALUE (or --NAME VALUE), the environment variable is STRIPEDB_NAME with
 * dashes as underscores and upper case (--http-listen -> STRIPEDB_HTTP_LISTEN), and the
 * config file key is NAME. Options are scoped: flags given after `--role=ROLE` apply to
 * that role only (so `--role=shard --listen=A --role=proxy --listen=B` works); in the
 * config file, keys outside any section are global and keys under `[ROLE]` apply to that
 * role. Values are validated when parsed: a bad address, integer or path is a usage
 * error (exit code 2 with one line on stderr).
 *
 * Option names are the operator interface of ../shared/DESIGN.md §3a.
 */
#ifndef SDB_COMMON_CONFIG_H
#define SDB_COMMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
	SDB_OPT_STRING = 0, /* free text */
	SDB_OPT_ADDR,       /* HOST:PORT, port 0-65535, host an IPv4/IPv6 literal or name */
	SDB_OPT_ADDRS,      /* comma-separated HOST:PORT list */
	SDB_OPT_MEMBERS,    /* comma-separated ID@HOST:PORT list (raft members) */
	SDB_OPT_INT,        /* decimal int64 >= 0 */
	SDB_OPT_PATH,       /* filesystem path (not checked for existence) */
	SDB_OPT_BOOL,       /* true/false/1/0/yes/no; a bare --flag means true */
	SDB_OPT_LEVEL,      /* log level */
} sdb_opt_kind;

/* X(name-with-dashes, C identifier, kind, default or NULL, help) */
#define SDB_OPTIONS(X)                                                                          \
	X("config", config, SDB_OPT_PATH, NULL,                                                 \
	  "config file (default /etc/stripedb/stripedb.conf when it exists)")                   \
	X("node-id", node_id, SDB_OPT_STRING, NULL,                                             \
	  "this node's id (metadata, shard replica set: raft id 1..N)")                         \
	X("replica-set", replica_set, SDB_OPT_STRING, NULL,                                     \
	  "shard: replica set name (hello's setName); members need --raft-listen")              \
	X("data-dir", data_dir, SDB_OPT_PATH, NULL, "directory for durable state")                \
	X("listen", listen, SDB_OPT_ADDR, NULL, "MongoDB wire protocol address HOST:PORT")        \
	X("http-listen", http_listen, SDB_OPT_ADDR, NULL, "HTTP address for /healthz, /metrics")   \
	X("raft-listen", raft_listen, SDB_OPT_ADDR, NULL, "metadata, shard: raft transport address")     \
	X("grpc-listen", grpc_listen, SDB_OPT_ADDR, NULL,                                       \
	  "ratelimit, proxy: rate-limit gRPC address (a proxy with it joins the peer ring)")    \
	X("advertise", advertise, SDB_OPT_ADDR, NULL, "address peers use to reach this node")     \
	X("bootstrap-members", bootstrap_members, SDB_OPT_MEMBERS, NULL,                        \
	  "metadata, shard: initial raft members ID@HOST:PORT,...")                                    \
	X("metadata", metadata, SDB_OPT_ADDRS, NULL, "metadata members HOST:PORT,...")            \
	X("peers", peers, SDB_OPT_ADDRS, NULL,                                                   \
	  "ratelimit, proxy: static rate-limit peer ring HOST:PORT,... (else from --metadata)") \
	X("cdc", cdc, SDB_OPT_STRING, NULL, "coordinator: CDC log embedded:DIR or kafka:BOOTSTRAP") \
	X("archive", archive, SDB_OPT_STRING, NULL,                                             \
	  "coordinator: CDC archive file:DIR or s3://BUCKET/PREFIX")                            \
	X("archive-retention", archive_retention, SDB_OPT_STRING, "7d",                          \
	  "coordinator: how long archived CDC segments are kept: N[s|m|h|d], 0 = forever")      \
	X("backup-interval", backup_interval, SDB_OPT_STRING, "0",                              \
	  "coordinator: back each shard up into the archive this often: N[s|m|h|d], 0 = never") \
	X("s3-endpoint", s3_endpoint, SDB_OPT_STRING, NULL,                                     \
	  "coordinator: S3-compatible endpoint URL of an s3:// archive")                        \
	X("s3-region", s3_region, SDB_OPT_STRING, "us-east-1",                                  \
	  "coordinator: signing region of an s3:// archive")                                    \
	X("s3-credentials-file", s3_credentials_file, SDB_OPT_PATH, NULL,                       \
	  "coordinator: AWS shared credentials file (default: AWS_ACCESS_KEY_ID, "              \
	  "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)")                                          \
	X("max-connections", max_connections, SDB_OPT_INT, "10000",                             \
	  "maximum client connections per wire listener")                                       \
	X("log-level", log_level, SDB_OPT_LEVEL, "info", "debug, info, warn or error")            \
	X("shutdown-timeout-ms", shutdown_timeout_ms, SDB_OPT_INT, "10000",                     \
	  "graceful shutdown: how long to drain in-flight requests (ms)")                       \
	X("raft-snapshot-threshold", raft_snapshot_threshold, SDB_OPT_INT, "1024",              \
	  "metadata, shard: raft log entries between state machine snapshots")                        \
	X("raft-election-timeout-ms", raft_election_timeout_ms, SDB_OPT_INT, NULL,              \
	  "metadata, shard: raft election timeout (ms; default 1000 for metadata, 750 for a "  \
	  "shard); heartbeats every tenth of it")                                                \
	X("max-chunks-per-command", max_chunks_per_command, SDB_OPT_INT, "1000000",             \
	  "metadata: most chunks one shardCollection may create (the leader refuses more)")     \
	X("stale-retry-ms", stale_retry_ms, SDB_OPT_INT, "5000",                                \
	  "proxy: budget for retrying a request refused with StaleConfig, or by a shard that "  \
	  "is restarting (ms)")                                                                 \
	X("shutdown-quiesce-ms", shutdown_quiesce_ms, SDB_OPT_INT, "2000",                      \
	  "graceful shutdown: quiesce period (ms) before the drain, during which wire clients " \
	  "are told ShutdownInProgress and move to other servers")                              \
	X("ttl-monitor-sleep-secs", ttl_monitor_sleep_secs, SDB_OPT_INT, "60",                   \
	  "shard: seconds between TTL monitor passes on the primary (0 = off)")                 \
	X("oplog-max-bytes", oplog_max_bytes, SDB_OPT_INT, "268435456",                         \
	  "shard: oplog size cap (bytes); the oldest entries beyond it are trimmed")            \
	X("oplog-max-age-s", oplog_max_age_s, SDB_OPT_INT, "0",                                 \
	  "shard: oplog age cap (s); older entries are trimmed (0 = no age limit)")             \
	X("transaction-lifetime-limit-seconds", transaction_lifetime_limit_seconds, SDB_OPT_INT, \
	  "60", "shard: an open multi-document transaction older than this is aborted (s)")      \
	X("logical-session-timeout-minutes", logical_session_timeout_minutes, SDB_OPT_INT, "30", \
	  "shard: retryable-write records of a session unused this long are forgotten (min)")   \
	X("enable-test-commands", enable_test_commands, SDB_OPT_BOOL, "false",                  \
	  "shard, proxy: accept the test command configureFailPoint (failCommand); never in production") \
	X("migration-budget", migration_budget, SDB_OPT_INT, "8",                               \
	  "coordinator: migrations active at once fleet-wide; others wait for a slot")          \
	X("migration-shard-budget", migration_shard_budget, SDB_OPT_INT, "2",                   \
	  "coordinator: migrations active at once touching one shard")                          \
	X("cursor-timeout-ms", cursor_timeout_ms, SDB_OPT_INT, "600000",                        \
	  "proxy, shard: idle cursors (not noCursorTimeout) are killed after this long (ms)")                \
	X("cache-size", cache_size, SDB_OPT_INT, NULL,                                          \
	  "ratelimit: max keys in the rate-limit cache (default GUBER_CACHE_SIZE or 50000)") \
	X("ratelimit-lease-ms", ratelimit_lease_ms, SDB_OPT_INT, "3000",                      \
	  "ratelimit/proxy: lease of this peer's registration in metadata (ms, 1000..600000); "  \
	  "renewed every third of it; a peer whose lease lapses leaves every ring")              \
	X("cdc-fsync", cdc_fsync, SDB_OPT_STRING, "batch",                                      \
	  "coordinator: embedded CDC log fsync: batch (every published batch), segment, never") \
	X("cdc-segment-bytes", cdc_segment_bytes, SDB_OPT_INT, "67108864",                      \
	  "coordinator: embedded CDC log segment size (bytes)")                                 \
	X("cdc-retention-bytes", cdc_retention_bytes, SDB_OPT_INT, "0",                         \
	  "coordinator: embedded CDC log bytes of closed segments kept per shard; older ones "   \
	  "are archived then deleted (0 = keep all)")                                           \
	X("cdc-lease-ms", cdc_lease_ms, SDB_OPT_INT, "5000",                                    \
	  "coordinator: TTL of the cdc/<shard> publisher leases (ms)")                          \
	X("auth", auth, SDB_OPT_STRING, "auto",                                                 \
	  "proxy: enabled (SCRAM and tenant authorization, issue #10), disabled, or auto "     \
	  "(enabled when --cluster-key-file is set)")                                           \
	X("auth-failure-limit", auth_failure_limit, SDB_OPT_INT, "10",                          \
	  "proxy: failed authentications per user and per client host per minute before "     \
	  "authentication is refused (brute-force limit)")                                      \
	X("cluster-key-file", cluster_key_file, SDB_OPT_PATH, NULL,                             \
	  "shared secret of the cluster members (mode 600, base64 characters): shard and "      \
	  "metadata listeners then accept commands only from members (SCRAM as __system)")      \
	X("tls-mode", tls_mode, SDB_OPT_STRING, "disabled",                                     \
	  "TLS on the wire listener (proxy, shard, metadata) and the ratelimit gRPC listener: " \
	  "disabled, allowed (TLS or plaintext; gRPC: TLS) or required")                        \
	X("tls-cert", tls_cert, SDB_OPT_PATH, NULL,                                             \
	  "PEM certificate chain of the listeners (and the client certificate of "              \
	  "--tls-internal)")                                                                    \
	X("tls-key", tls_key, SDB_OPT_PATH, NULL, "PEM private key matching --tls-cert")         \
	X("tls-ca", tls_ca, SDB_OPT_PATH, NULL,                                                 \
	  "PEM CA bundle: proxy clients' certificates are verified when presented; shard, "     \
	  "metadata and gRPC clients must present one signed by it (mutual TLS)")               \
	X("tls-internal", tls_internal, SDB_OPT_BOOL, "false",                                  \
	  "connect to shards, metadata members and rate-limit peers with TLS: servers "         \
	  "verified against --tls-ca, --tls-cert/--tls-key presented as client certificate")    \
	X("raft-tls", raft_tls, SDB_OPT_STRING, "auto",                                         \
	  "metadata: security of the raft port: enabled (mutual TLS with --tls-cert/--tls-key/" \
	  "--tls-ca and/or the cluster key's HMAC handshake), disabled (plaintext, warned), or " \
	  "auto (enabled when either is configured)")                                           \
	X("http-tls", http_tls, SDB_OPT_BOOL, "false",                                          \
	  "serve the HTTP listener (/healthz, /metrics, rate-limit gateway) over HTTPS with "   \
	  "--tls-cert/--tls-key")

typedef enum {
#define SDB__OPT_ENUM(name, id, kind, def, help) SDB_OPT_##id,
	SDB_OPTIONS(SDB__OPT_ENUM)
#undef SDB__OPT_ENUM
	SDB_OPT__COUNT
} sdb_opt;

/* The settings of one role (or the global scope). Values are heap strings owned by the
 * config; NULL when unset and without default. */
typedef struct sdb_config {
	char *role; /* "shard", "proxy", ... or NULL for the global scope */
	char *values[SDB_OPT__COUNT];
} sdb_config;

/* The roles to run, each with its resolved configuration. */
typedef struct sdb_config_set {
	size_t n_roles;
	sdb_config *roles; /* n_roles entries, in command-line order */
	sdb_config global;
} sdb_config_set;

/* Known role names, NULL-terminated: metadata, proxy, coordinator, ratelimit, shard. */
extern const char *const sdb_role_names[];

/* Parse argv (without the program name) into *out, resolving flags, environment
 * (envp, NULL-terminated "K=V" strings) and the config file. Errors: SDB_EUSAGE for bad
 * usage (unknown flag or role, bad value in a flag, the environment or the file, a
 * config file syntax error, no role, a role given twice) or SDB_EIO for an unreadable
 * config file, with a one-line message in err. On error *out is left empty.
 * Free with sdb_config_set_free(). */
int sdb_config_parse(int argc, char **argv, char **envp, sdb_config_set *out, char *err,
		     size_t errlen);
void sdb_config_set_free(sdb_config_set *set);

/* Accessors. get returns the string value or NULL. get_int parses the value (or def when
 * unset). Returns: (get_bool) def when unset, else 1 for "true", "1" or "yes" and 0 for
 * anything else; never an error. */
const char *sdb_config_get(const sdb_config *cfg, sdb_opt opt);
int64_t sdb_config_get_int(const sdb_config *cfg, sdb_opt opt, int64_t def);
int sdb_config_get_bool(const sdb_config *cfg, sdb_opt opt, int def);

/* Split "HOST:PORT" into host (hostlen bytes) and *port; accepts "[v6]:port".
 * Errors: SDB_EINVAL with a message (empty, no port, bad host, port outside 0-65535). */
int sdb_addr_split(const char *addr, char *host, size_t hostlen, int *port, char *err,
		   size_t errlen);

/* Print the option table (used by --help). */
void sdb_config_print_help(void *stream);

#endif
