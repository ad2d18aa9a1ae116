/* Internals of `stripedb ctl cluster` (cli/cluster.c: bootstrap and status over SSH;
 * cli/cluster_spec.c: the spec file, validation and the per-host config it generates;
 * cli/cluster_agent.c: the helper that runs on a host). Not for use elsewhere. */
#ifndef SDB_CLI_CLUSTER_INT_H
#define SDB_CLI_CLUSTER_INT_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define CL_MAX_HOSTS 32
#define CL_MAX_EXT 16
#define CL_MAX_SSH_OPTS 16
#define CL_MAX_PUT (1024 * 1024)
#define CL_SSH_TIMEOUT_MS 60000
#define CL_PATH 256 /* paths in the spec: short, so every derived path fits PATH_MAX */

enum { R_METADATA, R_SHARD, R_RATELIMIT, R_PROXY, R_COORDINATOR, R__COUNT };

/* Ports of one host; 0 = the [cluster] default (port_def in cluster_spec.c). */
enum { P_META_WIRE, P_META_RAFT, P_SHARD_WIRE, P_PROXY_WIRE, P_PROXY_GRPC, P_RL_GRPC,
       P_HTTP_META, P_HTTP_SHARD, P_HTTP_RL, P_HTTP_PROXY, P_HTTP_COORD, P_SHARD_RAFT,
       P__COUNT };

/* The --role value of each R_* (start order, i.e. dependency order). */
extern const char *const cl_role_name[R__COUNT];

typedef struct cl_host {
	char name[64];
	char addr[128];
	unsigned roles; /* bit per R_* */
	int meta_id;    /* metadata: Raft id (0 = by order) */
	char shard_name[64];
	int shard_id;   /* shard: member id in its replica set (0 = by order) */
	char data_dir[CL_PATH];
	int port[P__COUNT];
	int port_line[P__COUNT]; /* spec line of each port key (0 = not set here) */
	int addr_line;
} cl_host;

typedef struct cl_spec {
	char path[CL_PATH];
	char ssh_user[64];
	char ssh_identity[PATH_MAX];
	int ssh_port;
	char *ssh_opts[CL_MAX_SSH_OPTS];
	int n_ssh_opts;
	char binary[CL_PATH];
	int launcher_systemd;
	char data_dir[CL_PATH];
	char config[CL_PATH];    /* remote config path ("" = launcher default) */
	char key_file[PATH_MAX]; /* local cluster key ("" = none) */
	char auth[16];           /* the proxies' --auth ("" = their default, auto) */
	char remote_key[CL_PATH];
	char log_level[16];
	int timeout_ms;
	int port[P__COUNT];
	int port_line[P__COUNT];
	cl_host hosts[CL_MAX_HOSTS];
	int n_hosts;
	struct {
		char name[64];
		char uri[512];
	} ext[CL_MAX_EXT];
	int n_ext;
	char err[768];
	int lineno;
	FILE *f; /* while parsing */
} cl_spec;

/* A growable text buffer (p is NUL-terminated, caller frees p). */
typedef struct sbuf {
	char *p;
	size_t len, cap;
} sbuf;

/* Append printf-formatted text to b. */
void cl_sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Returns: 1 when s is a path safe to pass to a remote shell (absolute, strict alphabet),
 * else 0. */
int cl_valid_path(const char *s);

/* Returns: the R_* of a --role name, -1 when unknown. */
int cl_role_index(const char *r);

/* Returns: port p (P_*) of host h: the host's own, else the [cluster] default, else
 * port_def's. */
int cl_port_of(const cl_spec *s, const cl_host *h, int p);

/* Read and check the spec at path into s (zeroed here first). Returns: 0, or -1 after
 * printing one stderr line naming the file (and line); s is then already released.
 * cl_free_spec releases what a loaded spec holds. */
int cl_load_spec(const char *path, cl_spec *s);
void cl_free_spec(cl_spec *s);

/* Remote paths of host h's config file and cluster key, into buf (n bytes). */
void cl_host_config_path(const cl_spec *s, const cl_host *h, char *buf, size_t n);
void cl_host_key_path(const cl_spec *s, const cl_host *h, char *buf, size_t n);

/* Append "H:P,H:P" of the metadata members' wire addresses to b. */
void cl_metadata_list(const cl_spec *s, sbuf *b);

/* The config file bootstrap writes on host h (caller frees). */
char *cl_host_config(const cl_spec *s, const cl_host *h);

/* `agent put` and `agent start` (run on a host over SSH; argv after the verb). Returns:
 * the exit code. */
int cl_agent_put(int argc, char **argv);
int cl_agent_start(int argc, char **argv);

/* ---- ssh (cluster_ssh.c): the runner of `ctl cluster bootstrap` ---- */

/* Print each ssh command line on stderr before running it (`ctl cluster -v`). */
extern int cl_verbose;

/* One `ssh HOST CMD` in flight: several run at once (one per host), each with stdin from a
 * temporary file and its stdout and stderr captured in others (no pipe to keep drained). */
typedef struct ssh_job {
	const cl_host *h;
	pid_t pid; /* 0: not started (err says why) */
	FILE *fin, *fout, *ferr;
	char err[256];
} ssh_job;

/* Start `ssh HOST CMD` (BatchMode, ConnectTimeout 10 s, the spec's port and options) with
 * stdin from in (len bytes, may be NULL), its stdout and stderr captured in temporary
 * files. Returns: 0, or -1 with the reason in j->err (then cl_ssh_finish reports it). */
int cl_ssh_start(const cl_spec *s, const cl_host *h, const char *cmd, const char *in,
		 size_t len, ssh_job *j);
/* Wait for a job started by cl_ssh_start (until deadline, monotonic ms, then SIGKILL).
 * Returns: the exit status (255: ssh itself failed), -1 when it could not run or timed
 * out; out (outlen bytes) gets the first line of stdout on success, of stderr on failure.
 * The job is closed. */
int cl_ssh_finish(ssh_job *j, uint64_t deadline, char *out, size_t outlen);
/* Close j's temporary files (idempotent). */
void cl_ssh_job_close(ssh_job *j);

#endif
