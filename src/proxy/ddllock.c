/* The proxies' DDL lock (issue #20): see ddllock.h. */
#include "proxy/ddllock.h"

#include <bson/bson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/proxy.h"

#define E_LOCK_BUSY 46 /* MongoDB's LockBusy */

/* op on lease name for holder (ttl for acquire and renew); *code gets metadata's error code
 * (0 when unreachable). Returns: proxy_meta_command's status. */
static int lease_cmd(ctx *c, const char *op, const char *name, const char *holder, int *code,
		     char *err, size_t errlen)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	int rc;

	BSON_APPEND_UTF8(&cmd, op, name);
	BSON_APPEND_UTF8(&cmd, "holder", holder);
	if (strcmp(op, "releaseLease") != 0)
		BSON_APPEND_INT64(&cmd, "ttlMS", DDL_LEASE_TTL_MS);
	*code = 0;
	rc = proxy_meta_command(c->p, &cmd, &reply, code, err, errlen);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	return rc;
}

/* The error of a failed metadata call answered on c. */
static int meta_error(ctx *c, int rc, int code, const char *err)
{
	if (rc == SDB_EPROTO && code != 0)
		return px_error(c, code, "%s", err);
	return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "%s", err);
}

int px_ddl_lock_acquire(ctx *c, const char *const *nss, size_t n, px_ddl_lock *l)
{
	static atomic_ullong next_op;
	const char *order[2];
	int64_t max_ms = px_get_int(c->cmd, "maxTimeMS", 0);
	uint64_t deadline;
	size_t i, k = 0;

	memset(l, 0, sizeof *l);
	snprintf(l->holder, sizeof l->holder, "%s pid %d op %llu",
		 c->p->advertise ? c->p->advertise : "proxy", (int)getpid(),
		 (unsigned long long)atomic_fetch_add(&next_op, 1));
	for (i = 0; i < n && k < 2; i++)
		if (k == 0 || strcmp(order[0], nss[i]) != 0)
			order[k++] = nss[i];
	if (k == 2 && strcmp(order[0], order[1]) > 0) {
		const char *t = order[0];
		order[0] = order[1];
		order[1] = t;
	}
	deadline = sdb_mono_ms() + (max_ms > 0 && max_ms <= INT32_MAX ? (uint64_t)max_ms
								  : DDL_LOCK_WAIT_MS);
	for (i = 0; i < k; i++) {
		char name[sizeof l->names[0]], err[512];
		int backoff = 10, code, rc;

		snprintf(name, sizeof name, "ddl/%s", order[i]);
		for (;;) {
			rc = lease_cmd(c, "acquireLease", name, l->holder, &code, err, sizeof err);
			if (rc == 0)
				break;
			if (rc != SDB_EPROTO || code != E_LOCK_BUSY || sdb_mono_ms() >= deadline) {
				px_ddl_lock_release(c, l);
				if (rc == SDB_EPROTO && code == E_LOCK_BUSY)
					return max_ms > 0
						? px_error(c, WIRE_ERR_MAX_TIME_EXPIRED,
							   "operation exceeded time limit waiting for "
							   "the DDL lock of %s (%s)", order[i], err)
						: px_error(c, E_LOCK_BUSY,
							   "timed out after %d ms waiting for the DDL "
							   "lock of %s: another shardCollection or "
							   "renameCollection holds it (%s)",
							   DDL_LOCK_WAIT_MS, order[i], err);
				return meta_error(c, rc, code, err);
			}
			sdb_sleep_ms(backoff);
			backoff = backoff * 2 > 200 ? 200 : backoff * 2;
		}
		snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
	}
	return 0;
}

int px_ddl_lock_renew(ctx *c, px_ddl_lock *l)
{
	for (size_t i = 0; i < l->n; i++) {
		char err[512];
		int code, rc = lease_cmd(c, "renewLease", l->names[i], l->holder, &code, err,
					 sizeof err);
		if (rc == SDB_EPROTO && code == E_LOCK_BUSY)
			return px_error(c, E_LOCK_BUSY,
					"lost the DDL lock %s (it lapsed after %d ms): nothing was "
					"changed, retry the command",
					l->names[i], DDL_LEASE_TTL_MS);
		if (rc != 0)
			return meta_error(c, rc, code, err);
	}
	return 0;
}

void px_ddl_lock_release(ctx *c, px_ddl_lock *l)
{
	for (size_t i = 0; i < l->n; i++) {
		char err[512];
		int code;
		if (lease_cmd(c, "releaseLease", l->names[i], l->holder, &code, err, sizeof err) != 0)
			sdb_warn("ddl lock: release failed; the lease lapses by itself", "lease=%s "
				 "holder=\"%s\" err=\"%s\"", l->names[i], l->holder, err);
	}
	l->n = 0;
}
