/* file: archive of closed CDC segments. See archive.h. */
#include "cdc/archive.h"

#include <stdlib.h>
#include <string.h>

#include "cdc/segdir.h"
#include "common/alloc.h"
#include "common/err.h"

struct cdc_archive {
	char *root;
};

int cdc_archive_open(const char *spec, cdc_archive **out, char *err, size_t errlen)
{
	cdc_archive *a;
	int rc;
	if (strncmp(spec, "file:", 5) != 0 || spec[5] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL,
				"archive '%s': expected file:DIR", spec);
	rc = cdc_mkdirs(spec + 5, err, errlen);
	if (rc)
		return sdb_errwrap(err, errlen, rc, "archive");
	a = sdb_calloc(1, sizeof *a);
	a->root = sdb_strdup(spec + 5);
	*out = a;
	return 0;
}

void cdc_archive_close(cdc_archive *a)
{
	if (a == NULL)
		return;
	free(a->root);
	free(a);
}

char *cdc_archive_dir(const cdc_archive *a, const char *shard)
{
	return sdb_asprintf("%s/%s", a->root, shard);
}

int cdc_archive_put(cdc_archive *a, const char *shard, const char *live_dir,
		    uint64_t first_offset, char *err, size_t errlen)
{
	char *dir = cdc_archive_dir(a, shard);
	int rc = cdc_segdir_copy(live_dir, dir, first_offset, err, errlen);
	free(dir);
	return rc ? sdb_errwrap(err, errlen, rc, "archive") : 0;
}

int cdc_archive_range(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		      size_t errlen)
{
	char *dir = cdc_archive_dir(a, shard);
	int rc = cdc_segdir_range(dir, out, err, errlen);
	free(dir);
	return rc;
}
