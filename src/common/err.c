/* Status codes: see err.h. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *sdb_strerror(int rc)
{
	switch (rc) {
	case SDB_OK:
		return "ok";
#define SDB__ERR_CASE(name, num, msg) \
	case SDB_E##name:              \
		return msg;
		SDB_ERRNO_MAP(SDB__ERR_CASE)
#undef SDB__ERR_CASE
	default:
		return "unknown error";
	}
}

int sdb_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0) {
		return rc;
	}
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

int sdb_errwrap(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	char prefix[256];
	char old[1024];
	va_list ap;

	if (err == NULL || errlen == 0) {
		return rc;
	}
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	snprintf(old, sizeof old, "%s", err);
	snprintf(err, errlen, "%s: %s", prefix, old);
	return rc;
}
