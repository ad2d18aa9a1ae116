/* stripedb: one binary, role chosen by flag (DESIGN.md §2, §3a).
 *
 *   stripedb --role=ROLE [--config FILE] [flags]   run one or several roles
 *   stripedb ctl ...                               the operator CLI (cli/)
 *   stripedb dev up|status|down|kill|restart       a local cluster (cli/dev.c)
 *   stripedb --version | --help
 *
 * Exit codes: 0 clean shutdown, 1 runtime failure (e.g. a port in use), 2 bad usage
 * (unknown role or flag, bad value, unreadable config file) with one line on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench/bench.h"
#include <mongoc/mongoc.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/role.h"
#include "build_config.h"

extern char **environ;

/* libmongoc logs through its own handler to stdout/stderr, unstructured and at DEBUG level
 * too; route it into our logfmt logger (role and node on every line) at the right level. */
static void mongoc_log_to_sdb(mongoc_log_level_t level, const char *domain, const char *message,
			      void *data)
{
	sdb_log_level l;
	char q[1024];

	(void)data;
	switch (level) {
	case MONGOC_LOG_LEVEL_ERROR:
	case MONGOC_LOG_LEVEL_CRITICAL:
		l = SDB_LOG_ERROR;
		break;
	case MONGOC_LOG_LEVEL_WARNING:
		l = SDB_LOG_WARN;
		break;
	case MONGOC_LOG_LEVEL_MESSAGE:
	case MONGOC_LOG_LEVEL_INFO:
		l = SDB_LOG_INFO;
		break;
	default:
		l = SDB_LOG_DEBUG;
		break;
	}
	sdb_log(l, "libmongoc", "domain=%s detail=%s", domain != NULL ? domain : "",
		sdb_logq(q, sizeof q, message != NULL ? message : ""));
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: stripedb --role=ROLE [--role=ROLE ...] [options]\n"
		"       stripedb ctl --metadata=H:P,... SUBCOMMAND ...   (stripedb ctl --help)\n"
		"       stripedb dev up|status|down|kill|restart [--dir DIR]   (stripedb dev --help)\n"
		"       stripedb demo [--dir DIR] [--cdc embedded|kafka]      the whole system at work\n"
		"       stripedb bench [options]                              workload generator\n"
		"       stripedb --version | --help\n"
		"\n"
		"roles: metadata, proxy, coordinator, ratelimit, shard. Options given after a\n"
		"--role apply to that role only; options before the first --role apply to all.\n"
		"Every option also reads from STRIPEDB_<OPTION> (e.g. STRIPEDB_HTTP_LISTEN) and\n"
		"from the config file (INI; global keys, or keys under [ROLE] sections).\n"
		"\noptions:\n");
	sdb_config_print_help(f);
}

int main(int argc, char **argv)
{
	sdb_config_set set;
	char err[512] = "";
	sdb_log_level lvl;
	int rc;

	/* libmongoc initialises itself before main() and maps a /dev/shm counters file per
	 * process, which a SIGKILL leaves behind and whose failure it reports on stderr.
	 * stripedb exports its own metrics, so the counters are off; the variable must be set
	 * before the library loads, hence one re-exec at start (skipped if exec fails). */
	if (getenv("MONGOC_DISABLE_SHM") == NULL) {
		char shm[32];
		/* the counters file this process image already created (libmongoc names it
		 * "/mongoc-PID"); exec would leak it, and a later process reusing the pid would
		 * find it taken */
		snprintf(shm, sizeof shm, "/mongoc-%d", (int)getpid());
		shm_unlink(shm);
		setenv("MONGOC_DISABLE_SHM", "1", 1);
		execv("/proc/self/exe", argv);
	}
	sdb_alloc_init();
	mongoc_log_set_handler(mongoc_log_to_sdb, NULL);
	if (argc >= 2 && strcmp(argv[1], "ctl") == 0) {
		return cli_main(argc - 2, argv + 2);
	}
	if (argc >= 2 && strcmp(argv[1], "dev") == 0) {
		return cli_dev_main(argc - 2, argv + 2);
	}
	if (argc >= 2 && strcmp(argv[1], "bench") == 0) {
		return bench_main(argc - 2, argv + 2);
	}
	if (argc >= 2 && strcmp(argv[1], "demo") == 0) {
		return cli_demo_main(argc - 2, argv + 2);
	}
	if (argc > 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0 ||
			 strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		fprintf(stderr, "stripedb: unexpected argument '%s' after %s\n", argv[2], argv[1]);
		return 2;
	}
	if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
		printf("stripedb %s\n", PACKAGE_VERSION);
		return 0;
	}
	if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
			  strcmp(argv[1], "help") == 0)) {
		usage(stdout);
		return 0;
	}
	rc = sdb_config_parse(argc - 1, argv + 1, environ, &set, err, sizeof err);
	if (rc != 0) {
		fprintf(stderr, "stripedb: %s\n", err);
		return 2;
	}
	if (sdb_log_parse_level(sdb_config_get(&set.global, SDB_OPT_log_level), &lvl) == 0) {
		sdb_log_set_level(lvl);
	}
	sdb_log_set_thread("main", sdb_config_get(&set.global, SDB_OPT_node_id));
	/* SIGHUP reloads (TLS certificates, the cluster key file ...) are registered by the
	 * code that loads each file (common/role.h sdb_on_sighup) */
	rc = sdb_roles_run(&set);
	sdb_config_set_free(&set);
	return rc;
}
