/* The ratelimit role. Placeholder until issue #3 lands: starting it fails with a clear
 * message rather than pretending to serve. */
#include "common/err.h"
#include "common/role.h"

static int ratelimit_start(sdb_role *role)
{
	return sdb_errf(role->err, sizeof role->err, SDB_EINVAL,
			"the ratelimit role is not implemented yet (issue #3)");
}

static void ratelimit_stop(sdb_role *role)
{
	sdb_role_stopped(role);
}

const sdb_role_def sdb_role_ratelimit = {
	.name = "ratelimit",
	.start = ratelimit_start,
	.stop = ratelimit_stop,
};
