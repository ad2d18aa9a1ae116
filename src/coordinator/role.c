/* The coordinator role. Placeholder until issue #8 lands: starting it fails with a clear
 * message rather than pretending to serve. */
#include "common/err.h"
#include "common/role.h"

static int coordinator_start(sdb_role *role)
{
	return sdb_errf(role->err, sizeof role->err, SDB_EINVAL,
			"the coordinator role is not implemented yet (issue #8)");
}

static void coordinator_stop(sdb_role *role)
{
	sdb_role_stopped(role);
}

const sdb_role_def sdb_role_coordinator = {
	.name = "coordinator",
	.start = coordinator_start,
	.stop = coordinator_stop,
};
