/* Structured logging: see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"

static atomic_int min_level = SDB_LOG_INFO;
static _Thread_local char t_role[32];
static _Thread_local char t_node[32];

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void sdb_log_set_level(sdb_log_level level)
{
	atomic_store(&min_level, (int)level);
}

int sdb_log_parse_level(const char *s, sdb_log_level *out)
{
	for (int i = 0; i < 4; i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*out = (sdb_log_level)i;
			return 0;
		}
	}
	if (strcmp(s, "warning") == 0) {
		*out = SDB_LOG_WARN;
		return 0;
	}
	return SDB_EINVAL;
}

void sdb_log_set_thread(const char *role, const char *node)
{
	snprintf(t_role, sizeof t_role, "%s", role != NULL ? role : "");
	snprintf(t_node, sizeof t_node, "%s", node != NULL ? node : "");
}

void sdb_log_get_thread(sdb_log_ctx *out)
{
	memcpy(out->role, t_role, sizeof out->role);
	memcpy(out->node, t_node, sizeof out->node);
}

void sdb_log_set_thread_ctx(const sdb_log_ctx *ctx)
{
	snprintf(t_role, sizeof t_role, "%s", ctx->role);
	snprintf(t_node, sizeof t_node, "%s", ctx->node);
}

void sdb_log_set_thread_role(const char *role)
{
	snprintf(t_role, sizeof t_role, "%s", role != NULL ? role : "");
}

const char *sdb_logq(char *buf, unsigned n, const char *s)
{
	int needs = (*s == '\0');
	size_t o = 0;

	if (n == 0) {
		return "";
	}
	for (const char *p = s; *p != '\0'; p++) {
		if (*p == ' ' || *p == '"' || *p == '=' || *p == '\\' || (unsigned char)*p < 0x20) {
			needs = 1;
			break;
		}
	}
	if (!needs) {
		snprintf(buf, n, "%s", s);
		return buf;
	}
	buf[o++] = '"';
	for (const char *p = s; *p != '\0' && o + 3 < n; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '"' || c == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)c;
		} else if (c == '\n') {
			buf[o++] = '\\';
			buf[o++] = 'n';
		} else if (c < 0x20) {
			buf[o++] = ' ';
		} else {
			buf[o++] = (char)c;
		}
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

void sdb_log(sdb_log_level level, const char *msg, const char *fmt, ...)
{
	char line[4096];
	char q[1024];
	struct timespec ts;
	struct tm tm;
	size_t o;
	int n;

	if ((int)level < atomic_load(&min_level)) {
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
		     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
	o = (size_t)n;
	if (t_role[0] != '\0') {
		o += (size_t)snprintf(line + o, sizeof line - o, " role=%s", t_role);
	}
	if (t_node[0] != '\0' && o < sizeof line) {
		o += (size_t)snprintf(line + o, sizeof line - o, " node=%s", t_node);
	}
	if (o < sizeof line) {
		o += (size_t)snprintf(line + o, sizeof line - o, " msg=%s",
				      sdb_logq(q, sizeof q, msg));
	}
	if (fmt != NULL && fmt[0] != '\0' && o + 1 < sizeof line) {
		va_list ap;
		line[o++] = ' ';
		va_start(ap, fmt);
		n = vsnprintf(line + o, sizeof line - o, fmt, ap);
		va_end(ap);
		if (n > 0) {
			o += (size_t)n;
		}
	}
	if (o >= sizeof line - 1) {
		o = sizeof line - 2;
	}
	line[o++] = '\n';
	{
		ssize_t w = write(STDERR_FILENO, line, o);
		(void)w;
	}
}
