/* The metadata role. Placeholder until issue #5 lands: starting it fails with a clear
 * message rather than pretending to serve. */
#include "common/err.h"
#include "common/role.h"

static int metadata_start(sdb_role *role)
{
	return sdb_errf(role->err, sizeof role->err, SDB_EINVAL,
			"the metadata role is not implemented yet (issue #5)");
}

static void metadata_stop(sdb_role *role)
{
	sdb_role_stopped(role);
}

const sdb_role_def sdb_role_metadata = {
	.name = "metadata",
	.start = metadata_start,
	.stop = metadata_stop,
};
