/* `ctl cluster bootstrap`'s SSH runner (cluster_int.h): `ssh HOST CMD` jobs run in parallel,
 * one per host, each with stdin from a temporary file and its output captured in others
 * (no pipe to keep drained), killed at a deadline. */
#include "build_config.h"

#include "cli/cluster_int.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"

int cl_verbose;

void cl_ssh_job_close(ssh_job *j)
{
	FILE **fs[3] = {&j->fin, &j->fout, &j->ferr};

	for (int k = 0; k < 3; k++) {
		if (*fs[k] != NULL) {
			fclose(*fs[k]);
			*fs[k] = NULL;
		}
	}
}

/* Start `ssh HOST CMD` with stdin from in (len bytes, may be NULL). Returns 0, or -1 with
 * the reason in j->err (then cl_ssh_finish reports it). */
int cl_ssh_start(const cl_spec *s, const cl_host *h, const char *cmd, const char *in,
		 size_t len, ssh_job *j)
{
	char *argv[16 + 2 * CL_MAX_SSH_OPTS];
	char port[16];
	int argc = 0;

	memset(j, 0, sizeof *j);
	j->h = h;
	j->fin = tmpfile();
	j->fout = tmpfile();
	j->ferr = tmpfile();
	if (j->fin == NULL || j->fout == NULL || j->ferr == NULL ||
	    (in != NULL && (fwrite(in, 1, len, j->fin) != len || fflush(j->fin) != 0))) {
		snprintf(j->err, sizeof j->err, "tmpfile: %s", strerror(errno));
		cl_ssh_job_close(j);
		return -1;
	}
	rewind(j->fin);
	snprintf(port, sizeof port, "%d", s->ssh_port > 0 ? s->ssh_port : 22);
	argv[argc++] = "ssh";
	argv[argc++] = "-o";
	argv[argc++] = "BatchMode=yes";
	argv[argc++] = "-o";
	argv[argc++] = "ConnectTimeout=10";
	argv[argc++] = "-p";
	argv[argc++] = port;
	argv[argc++] = "-l";
	argv[argc++] = (char *)s->ssh_user;
	if (s->ssh_identity[0] != '\0') {
		argv[argc++] = "-i";
		argv[argc++] = (char *)s->ssh_identity;
	}
	for (int i = 0; i < s->n_ssh_opts; i++) {
		argv[argc++] = "-o";
		argv[argc++] = s->ssh_opts[i];
	}
	argv[argc++] = "--";
	argv[argc++] = (char *)h->addr;
	argv[argc++] = (char *)cmd;
	argv[argc] = NULL;
	if (cl_verbose) {
		fprintf(stderr, "+ ssh %s %s\n", h->addr, cmd);
	}
	fflush(stdout);
	fflush(stderr);
	j->pid = fork();
	if (j->pid < 0) {
		j->pid = 0;
		snprintf(j->err, sizeof j->err, "fork: %s", strerror(errno));
		cl_ssh_job_close(j);
		return -1;
	}
	if (j->pid == 0) {
		dup2(fileno(j->fin), 0);
		dup2(fileno(j->fout), 1);
		dup2(fileno(j->ferr), 2);
		execvp("ssh", argv);
		fprintf(stderr, "exec ssh: %s\n", strerror(errno));
		_exit(127);
	}
	return 0;
}

/* Wait for a job started by cl_ssh_start (at most CL_SSH_TIMEOUT_MS after deadline_base, then
 * SIGKILL). Returns the exit status (255: ssh itself failed), -1 when it could not run or
 * timed out; out gets the first line of stdout on success, of stderr on failure. */
int cl_ssh_finish(ssh_job *j, uint64_t deadline, char *out, size_t outlen)
{
	int status = 0, rc = -1;
	char line[512] = "";

	out[0] = '\0';
	if (j->pid == 0) {
		snprintf(out, outlen, "%s", j->err);
		return -1;
	}
	for (;;) {
		pid_t w = waitpid(j->pid, &status, WNOHANG);
		if (w == j->pid) {
			break;
		}
		if (w < 0 && errno != EINTR) {
			snprintf(out, outlen, "waitpid: %s", strerror(errno));
			goto done;
		}
		if (sdb_mono_ms() > deadline) {
			kill(j->pid, SIGKILL);
			waitpid(j->pid, &status, 0);
			snprintf(out, outlen, "ssh timed out after %d s", CL_SSH_TIMEOUT_MS / 1000);
			goto done;
		}
		sdb_sleep_ms(10);
	}
	rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	rewind(rc == 0 ? j->fout : j->ferr);
	if (fgets(line, sizeof line, rc == 0 ? j->fout : j->ferr) == NULL) {
		line[0] = '\0';
	}
	line[strcspn(line, "\r\n")] = '\0';
	snprintf(out, outlen, "%s", line);
done:
	j->pid = 0;
	cl_ssh_job_close(j);
	return rc;
}

/* --- network checks --- */
