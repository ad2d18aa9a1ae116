/* The proxy role. Placeholder until issue #6 lands: starting it fails with a clear
 * message rather than pretending to serve. */
#include "common/err.h"
#include "common/role.h"

static int proxy_start(sdb_role *role)
{
	return sdb_errf(role->err, sizeof role->err, SDB_EINVAL,
			"the proxy role is not implemented yet (issue #6)");
}

static void proxy_stop(sdb_role *role)
{
	sdb_role_stopped(role);
}

const sdb_role_def sdb_role_proxy = {
	.name = "proxy",
	.start = proxy_start,
	.stop = proxy_stop,
};
