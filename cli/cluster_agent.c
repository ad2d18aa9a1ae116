/* `stripedb ctl cluster agent put|start`: the helper bootstrap runs on a host over SSH
 * (launcher = direct): writes files atomically with their mode and owner, and starts a role
 * in its own session with its pid file (a live pid of the same role and config is left
 * alone; a reused pid is replaced). See cli/cluster.c. */
#include "cli/cli.h"
#include "cli/cluster_int.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <mongoc/mongoc.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"


/* --- the agent: runs on a host, invoked over ssh --- */

static int self_exe(char *buf, size_t n)
{
	ssize_t len = readlink("/proc/self/exe", buf, n - 1);

	if (len <= 0) {
		return -1;
	}
	buf[len] = '\0';
	return 0;
}

static void strip_deleted(char *path)
{
	static const char suffix[] = " (deleted)";
	size_t n = strlen(path), k = sizeof suffix - 1;

	if (n > k && strcmp(path + n - k, suffix) == 0) {
		path[n - k] = '\0';
	}
}

static int mkdirs(const char *dir, mode_t mode)
{
	char tmp[PATH_MAX];

	snprintf(tmp, sizeof tmp, "%s", dir);
	for (char *p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			if (mkdir(tmp, mode) != 0 && errno != EEXIST) {
				return -1;
			}
			*p = '/';
		}
	}
	return mkdir(tmp, mode) != 0 && errno != EEXIST ? -1 : 0;
}

/* Write data (len bytes) to path with mode (and owner pw when not NULL), atomically,
 * unless path already holds exactly that. Prints "PATH written|unchanged". */
static int put_one(const char *path, mode_t mode, const struct passwd *pw, const char *data,
		   size_t len)
{
	char *old = NULL, *tmp = NULL, *dir = NULL;
	size_t oldlen = 0;
	int fd = -1, rc = 1;
	struct stat st;

	if (stat(path, &st) == 0 && (st.st_mode & 0777) == mode && (size_t)st.st_size == len &&
	    (pw == NULL || st.st_uid == pw->pw_uid)) {
		FILE *f = fopen(path, "r");
		old = sdb_malloc(len + 1);
		if (f != NULL) {
			oldlen = fread(old, 1, len + 1, f);
			fclose(f);
		}
		if (oldlen == len && memcmp(old, data, len) == 0) {
			printf("%s unchanged\n", path);
			rc = 0;
			goto done;
		}
	}
	dir = sdb_strdup(path);
	*strrchr(dir, '/') = '\0';
	if (dir[0] != '\0' && mkdirs(dir, 0755) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent put: mkdir %s: %s\n", dir, strerror(errno));
		goto done;
	}
	tmp = sdb_asprintf("%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || fchmod(fd, mode) != 0 || (pw != NULL && fchown(fd, pw->pw_uid, pw->pw_gid) != 0) ||
	    write(fd, data, len) != (ssize_t)len || fsync(fd) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent put: %s: %s\n", tmp, strerror(errno));
		unlink(tmp);
		goto done;
	}
	if (close(fd) != 0 || rename(tmp, path) != 0) {
		fd = -1;
		fprintf(stderr, "stripedb ctl cluster agent put: %s: %s\n", path, strerror(errno));
		unlink(tmp);
		goto done;
	}
	fd = -1;
	printf("%s written\n", path);
	rc = 0;
done:
	if (fd >= 0) {
		close(fd);
	}
	if (old != NULL) {
		memset(old, 0, len + 1);
	}
	free(old);
	free(tmp);
	free(dir);
	return rc;
}

/* agent put PATH MODE OWNER|- SIZE [PATH MODE OWNER|- SIZE]...: stdin (at most 1 MiB in
 * all) is the files' contents one after the other, SIZE bytes each; each goes to its PATH
 * (put_one). One ssh round trip writes a host's config file and its cluster key. */
int cl_agent_put(int argc, char **argv)
{
	char *data = NULL;
	size_t len = 0, want = 0, off = 0;
	int rc = 2;

	if (argc == 0 || argc % 4 != 0) {
		fprintf(stderr, "stripedb ctl cluster agent put: usage: put PATH MODE OWNER|- SIZE ...\n");
		return 2;
	}
	for (int i = 0; i < argc; i += 4) {
		char *end;
		long mode = strtol(argv[i + 1], &end, 8);
		long long size;
		if (!cl_valid_path(argv[i]) || *end != '\0' || mode < 0 || mode > 0777) {
			fprintf(stderr, "stripedb ctl cluster agent put: bad path or mode '%s' '%s'\n",
				argv[i], argv[i + 1]);
			return 2;
		}
		size = strtoll(argv[i + 3], &end, 10);
		if (*end != '\0' || size < 0 || size > CL_MAX_PUT || want + (size_t)size > CL_MAX_PUT) {
			fprintf(stderr, "stripedb ctl cluster agent put: bad size '%s' (at most %d bytes "
					"in all)\n", argv[i + 3], CL_MAX_PUT);
			return 2;
		}
		want += (size_t)size;
	}
	data = sdb_malloc(CL_MAX_PUT + 1);
	for (;;) {
		ssize_t n = read(0, data + len, CL_MAX_PUT + 1 - len);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n < 0) {
			fprintf(stderr, "stripedb ctl cluster agent put: stdin: %s\n", strerror(errno));
			rc = 1;
			goto done;
		}
		if (n == 0) {
			break;
		}
		len += (size_t)n;
		if (len > CL_MAX_PUT) {
			break;
		}
	}
	if (len != want) {
		fprintf(stderr, "stripedb ctl cluster agent put: got %zu bytes on stdin, want %zu\n", len,
			want);
		goto done;
	}
	rc = 0;
	for (int i = 0; i < argc && rc == 0; i += 4) {
		size_t size = (size_t)strtoll(argv[i + 3], NULL, 10);
		const struct passwd *pw = NULL;
		if (strcmp(argv[i + 2], "-") != 0 && (pw = getpwnam(argv[i + 2])) == NULL) {
			fprintf(stderr, "stripedb ctl cluster agent put: no user '%s'\n", argv[i + 2]);
			rc = 1;
			break;
		}
		rc = put_one(argv[i], (mode_t)strtol(argv[i + 1], NULL, 8), pw, data + off, size);
		off += size;
	}
done:
	if (data != NULL) {
		memset(data, 0, len < CL_MAX_PUT + 1 ? len : CL_MAX_PUT + 1);
	}
	free(data);
	return rc;
}

/* 1 when the NUL-separated argument vector of /proc/PID/cmdline holds both role_arg
 * ("--role=ROLE") and conf_arg ("--config=CONFIG"), as agent start execs them; else 0. */
static int cmdline_is(long pid, const char *role_arg, const char *conf_arg)
{
	char path[64], buf[4096];
	size_t n;
	int has_role = 0, has_conf = 0;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
	f = fopen(path, "r");
	if (f == NULL) {
		return 0;
	}
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	for (size_t off = 0; off < n; off += strlen(buf + off) + 1) {
		has_role |= strcmp(buf + off, role_arg) == 0;
		has_conf |= strcmp(buf + off, conf_arg) == 0;
	}
	return has_role && has_conf;
}

/* The pid in file, when it is a live process of this binary started as role_arg with
 * conf_arg (a reused pid, even of another stripedb role, is not); else 0. */
static int live_pid(const char *file, const char *role_arg, const char *conf_arg)
{
	char buf[32] = "", path[64], exe[PATH_MAX], self[PATH_MAX];
	FILE *f = fopen(file, "r");
	long pid;
	ssize_t n;

	if (f == NULL) {
		return 0;
	}
	if (fgets(buf, sizeof buf, f) == NULL) {
		buf[0] = '\0';
	}
	fclose(f);
	pid = strtol(buf, NULL, 10);
	if (pid <= 0 || pid > INT_MAX) {
		return 0;
	}
	snprintf(path, sizeof path, "/proc/%ld/exe", pid);
	n = readlink(path, exe, sizeof exe - 1);
	if (n <= 0 || self_exe(self, sizeof self) != 0) {
		return 0;
	}
	exe[n] = '\0';
	strip_deleted(exe);
	strip_deleted(self);
	{
		/* a zombie (exited, not reaped) is not alive */
		char stat_path[64], st[256] = "";
		FILE *sf;
		snprintf(stat_path, sizeof stat_path, "/proc/%ld/stat", pid);
		sf = fopen(stat_path, "r");
		if (sf != NULL) {
			if (fgets(st, sizeof st, sf) == NULL) {
				st[0] = '\0';
			}
			fclose(sf);
		}
		char *rp = strrchr(st, ')');
		if (rp != NULL && rp[1] == ' ' && rp[2] == 'Z') {
			return 0;
		}
	}
	return strcmp(exe, self) == 0 && cmdline_is(pid, role_arg, conf_arg) ? (int)pid : 0;
}

/* agent start ROLE CONFIG DATADIR: start `stripedb --role=ROLE --config=CONFIG` detached
 * unless DATADIR/run/ROLE.pid names a live stripedb whose command line is this role and
 * this config (else the pid file is stale, e.g. a reused pid, and is replaced). Prints
 * "started (pid N)" or "running (pid N)". */
static int agent_start_locked(int argc, char **argv)
{
	char exe[PATH_MAX], pidfile[PATH_MAX + 32], tmp[PATH_MAX + 48], log[PATH_MAX + 32];
	char run[PATH_MAX + 8], logs[PATH_MAX + 8], role_arg[64], conf_arg[PATH_MAX + 16];
	int fd, pid;
	pid_t child;
	FILE *f;

	if (argc != 3 || cl_role_index(argv[0]) < 0 || !cl_valid_path(argv[1]) || !cl_valid_path(argv[2])) {
		fprintf(stderr, "stripedb ctl cluster agent start: usage: start ROLE CONFIG DATADIR\n");
		return 2;
	}
	snprintf(run, sizeof run, "%s/run", argv[2]);
	snprintf(logs, sizeof logs, "%s/logs", argv[2]);
	snprintf(pidfile, sizeof pidfile, "%s/%s.pid", run, argv[0]);
	if (mkdirs(run, 0755) != 0 || mkdirs(logs, 0755) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: mkdir %s: %s\n", argv[2],
			strerror(errno));
		return 1;
	}
	snprintf(role_arg, sizeof role_arg, "--role=%s", argv[0]);
	snprintf(conf_arg, sizeof conf_arg, "--config=%s", argv[1]);
	pid = live_pid(pidfile, role_arg, conf_arg);
	if (pid > 0) {
		printf("running (pid %d)\n", pid);
		return 0;
	}
	if (self_exe(exe, sizeof exe) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: /proc/self/exe: %s\n", strerror(errno));
		return 1;
	}
	strip_deleted(exe);
	snprintf(log, sizeof log, "%s/%s.log", logs, argv[0]);
	fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	if (fd < 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: %s: %s\n", log, strerror(errno));
		return 1;
	}
	fflush(stdout);
	child = fork();
	if (child < 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: fork: %s\n", strerror(errno));
		close(fd);
		return 1;
	}
	if (child == 0) {
		char *cargv[] = {exe, role_arg, conf_arg, NULL};
		int null = open("/dev/null", O_RDONLY);
		setsid();
		dup2(null, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		for (int k = 3; k < 1024; k++) {
			close(k);
		}
		unsetenv("STRIPEDB_CONFIG");
		execv(exe, cargv);
		fprintf(stderr, "stripedb ctl cluster agent start: exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(fd);
	snprintf(tmp, sizeof tmp, "%s.tmp", pidfile);
	f = fopen(tmp, "w");
	if (f != NULL && fprintf(f, "%d\n", (int)child) < 0) {
		fclose(f);
		f = NULL;
	}
	if (f == NULL || fclose(f) != 0 || rename(tmp, pidfile) != 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: %s: %s\n", pidfile, strerror(errno));
		return 1;
	}
	printf("started (pid %d)\n", (int)child);
	return 0;
}

/* Two bootstraps at once (one interrupted, its ssh still running, and the next) must not
 * start a role twice: the check of the pid file and the start happen under an exclusive
 * flock(2) of DATADIR/run/ROLE.lock (released when the agent exits). */
int cl_agent_start(int argc, char **argv)
{
	char run[PATH_MAX + 8], lock[PATH_MAX + 48];
	int fd, rc;

	if (argc != 3 || cl_role_index(argv[0]) < 0 || !cl_valid_path(argv[2])) {
		return agent_start_locked(argc, argv); /* its usage error */
	}
	snprintf(run, sizeof run, "%s/run", argv[2]);
	snprintf(lock, sizeof lock, "%s/%s.lock", run, argv[0]);
	if (mkdirs(run, 0755) != 0 || (fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
		fprintf(stderr, "stripedb ctl cluster agent start: %s: %s\n", lock, strerror(errno));
		return 1;
	}
	while (flock(fd, LOCK_EX) != 0) {
		if (errno != EINTR) {
			fprintf(stderr, "stripedb ctl cluster agent start: flock %s: %s\n", lock,
				strerror(errno));
			close(fd);
			return 1;
		}
	}
	rc = agent_start_locked(argc, argv);
	close(fd);
	return rc;
}

