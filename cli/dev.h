/* The local cluster of `stripedb dev` (cli/dev.c), for the commands built on it
 * (`stripedb demo`, cli/demo.c).
 *
 * A cluster is recorded in DIR/cluster.json by `stripedb dev up`; these functions read it
 * and stop it. Not thread-safe (one caller at a time).
 */
#ifndef SDB_CLI_DEV_H
#define SDB_CLI_DEV_H

#include <limits.h>
#include <stddef.h>

#define DEV_MAX_PROCS 104 /* 16 shards x 5 members + the other roles */
#define DEV_MAX_ARGS 24

typedef struct dev_proc {
	char name[32];    /* metadata-1, shard-a-1 (shard-a with one member per set), proxy-1,
			   * coordinator-1, ratelimit-1 */
	char role[16];
	char set[32];     /* shard members: the replica set (= shard id, e.g. shard-a); else "" */
	int pid;
	int wire;         /* wire port (metadata, shard, proxy) or 0 */
	int http;         /* HTTP port */
	int raft;         /* metadata / shard member raft port or 0 */
	int grpc;         /* ratelimit / proxy gRPC port or 0 */
	char *argv[DEV_MAX_ARGS];
	int argc;
} dev_proc;

typedef struct dev_cluster {
	char dir[PATH_MAX];
	dev_proc procs[DEV_MAX_PROCS];
	int n;
	char cdc[16];
	char kafka[256];   /* bootstrap servers when cdc=kafka */
	int kafka_pid;
} dev_cluster;

/* Read DIR/cluster.json into *c (argv strings owned by c: dev_cluster_free). Returns: 0, or
 * -1 with one line on stderr (no cluster, bad JSON). */
int dev_cluster_load(const char *dir, dev_cluster *c);

/* Free what dev_cluster_load allocated. */
void dev_cluster_free(dev_cluster *c);

/* Stop every live process of c, role by role (proxies first, metadata last), with sig
 * first (SIGTERM: graceful) and SIGKILL after 20 s; then the Kafka mock. Returns when all
 * are gone. */
void dev_cluster_stop(dev_cluster *c, int sig);

/* Returns: the number of processes of c still alive (stripedb processes with the recorded
 * pids). */
int dev_cluster_alive(const dev_cluster *c);

/* "H:P,H:P,..." of the wire (grpc = 0) or gRPC (grpc = 1) addresses of role into buf. */
void dev_cluster_addrs(const dev_cluster *c, const char *role, int grpc, char *buf, size_t n);

/* The live member of shard replica set `set` that answers hello as the writable primary,
 * or NULL (none within timeout_ms, polling). */
const dev_proc *dev_cluster_primary(const dev_cluster *c, const char *set, int timeout_ms);

/* The replica-set URI of shard `set` (mongodb://127.0.0.1:P,.../?replicaSet=set) into buf. */
void dev_cluster_shard_uri(const dev_cluster *c, const char *set, char *buf, size_t n);

/* The path of the running stripedb binary into buf (for spawning `stripedb dev ...`). */
void dev_self_exe(char *buf, size_t n);

#endif
