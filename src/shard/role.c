/* The shard role. Placeholder until issue #4 lands: starting it fails with a clear
 * message rather than pretending to serve. */
#include "common/err.h"
#include "common/role.h"

static int shard_start(sdb_role *role)
{
	return sdb_errf(role->err, sizeof role->err, SDB_EINVAL,
			"the shard role is not implemented yet (issue #4)");
}

static void shard_stop(sdb_role *role)
{
	sdb_role_stopped(role);
}

const sdb_role_def sdb_role_shard = {
	.name = "shard",
	.start = shard_start,
	.stop = shard_stop,
};
